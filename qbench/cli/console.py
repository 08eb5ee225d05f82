"""What ``qbench sweep`` does, printed for people: the run matrix, progress bars, one-line
outcomes; and the consoles every command prints its tables to."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from qbench.errors import UserError
from qbench.launch import decision, preflight
from qbench.launch import sweep as sweep_mod
from qbench.records import interference
from qbench.records.schema import RunRecord
from qbench.records.store import ResultStore
from qbench.spec import checks
from qbench.spec import matrix as matrix_mod
from qbench.spec import scenario as scenario_mod
from qbench.spec.matrix import Matrix
from qbench.spec.runspec import RunSpec

# Wide when writing to a file or CI log, so run ids are never cut.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def sweep(
    text: str, source: str, out_dir: Path | None, dry_run: bool, *,
    launcher: str | None = None, retry_failed: bool = False, skip_unavailable: bool = False,
    check: bool = False, isolation: str | None = None, rerun_disturbed: int = 0,
) -> None:  # fmt: skip
    sc = scenario_mod.loads(text, source)
    target = out_dir or Path("results") / sc.name
    if target.exists() and not target.is_dir():
        raise UserError(f"results directory {target} exists and is not a directory; pick "
                        "another --out")  # fmt: skip
    try:
        m = matrix_mod.expand(sc)
    except checks.EmptyMatrix as e:
        if dry_run:  # the exclusions are the answer: show them, then the one-line error
            _print_matrix(Matrix([], e.excluded), target, preflight.check([]))
        raise
    launch = decision.launch_for(sc, launcher, m, isolation)
    if dry_run:
        verdicts = preflight.check(m.runs, launch=launch)
        _print_matrix(m, target, verdicts)
        if factories(m):
            err.print("note: --dry-run does not import model, dataset or loss factories; a "
                      "sweep imports and checks them before the first run")  # fmt: skip
        return
    if factories(m):  # the user's code: imported and tried once here, before any run starts
        # Here, not at the top: it imports torch, which `qbench sweep --dry-run` must not load.
        from qbench.run import workload

        workload.preflight(m.runs)
    p = sweep_mod.plan(m, ResultStore(target), retry_failed)
    verdicts = preflight.check(p.todo, launch=launch, out=target)
    if check:
        _print_check(verdicts, len(m.runs))
        return
    if verdicts.unavailable() and not skip_unavailable:
        raise verdicts.error()
    skip = {r: verdicts.reason(r) for r in verdicts.unavailable()}
    kept = (
        f", {len(p.kept_failed)} failed kept (--retry-failed redoes them)" if p.kept_failed else ""
    )
    skipping = f", {len(skip)} skipped (prerequisites missing)" if skip else ""
    err.print(f"sweep {sc.name!r}: {len(m.runs)} runs ({len(p.done)} already done{kept}"
              f"{skipping}), {len(m.excluded)} excluded, launcher {launch.kind}, isolation "
              f"{launch.effective_isolation} -> {target}")  # fmt: skip
    with _progress(len(p.todo) - len(skip)) as tick:
        summary = sweep_mod.run_sweep(
            m, target, text, on_progress=tick, launch=launch, retry_failed=retry_failed,
            resolved=decision.resolved(sc, launch), skip=skip, rerun_disturbed=rerun_disturbed,
            on_rerun=tick.rerun,
        )  # fmt: skip
    _print_outcome(summary)
    if summary.failed or summary.kept_failed:
        sys.exit(1)


def _print_check(verdicts: preflight.Verdicts, total: int) -> None:
    """``--check``: each missing prerequisite on a line of its own on stderr (exit 2), so that
    several scenarios' lines can be merged and deduplicated (``make figures``)."""
    missing = verdicts.missing()
    if not missing:
        out.print(f"ready: every run that is not done yet ({len(verdicts.runs)} of {total}) "
                  "can start on this machine")  # fmt: skip
        return
    for m in missing:
        print(m.line(), file=sys.stderr)
    sys.exit(2)


def factories(m: Matrix) -> bool:
    """Whether any run names a user's factory (model, dataset or loss)."""
    return any(
        r.workload.factory or r.workload.data or "factory" in r.workload.loss for r in m.runs
    )


def _print_matrix(m: Matrix, target: Path, verdicts: preflight.Verdicts) -> None:
    t = Table(title=f"{len(m.runs)} runs -> {target}")
    for col in ("run_id", "model", "backend", "scheme", "compressor", "ranks", "batch", "here"):
        t.add_column(col)
    for s in m.runs:
        lacks = verdicts.tags(s.run_id)
        t.add_row(
            s.run_id,
            s.workload.model,
            s.placement.backend,
            s.method.scheme_label,
            s.compressor_label,
            str(s.placement.world_size),
            str(s.workload.batch_size),
            escape(f"needs {lacks}" if lacks else "ok"),
        )
    out.print(t)
    if m.excluded:
        x = Table(title=f"{len(m.excluded)} excluded")
        x.add_column("combination")
        x.add_column("reason")
        for e in m.excluded:
            x.add_row(e.description, e.reason)
        out.print(x)
    missing = verdicts.missing()
    if missing:
        n = len(verdicts.unavailable())
        out.print(f"{n} of {len(m.runs)} runs cannot start on this machine (a sweep stops "
                  "before starting any; --skip-unavailable runs the others):")  # fmt: skip
        for item in missing:
            out.print(f"  {escape(item.line())}", soft_wrap=True)


class _Ticker:
    """Progress callback: a rich bar on a terminal, one line per run otherwise (CI logs)."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self.progress = total, 0, progress
        self.task = progress.add_task("runs", total=total) if progress else None
        self.t0 = time.monotonic()

    def __call__(self, spec: RunSpec, record: RunRecord | None) -> None:
        if record is None:
            if self.progress is not None and self.task is not None:
                self.progress.update(self.task, description=spec.run_id)
            return
        self.done += 1
        if self.progress is not None and self.task is not None:
            self.progress.advance(self.task)
            if record.status != "ok":
                self.progress.console.print(
                    f"[red]{record.status}[/] {spec.run_id}: {escape(record.error or '')}"
                )
            elif _disturbed_note(record):
                self.progress.console.print(
                    f"[yellow]ok[/] {spec.run_id}:{escape(_disturbed_note(record))}"
                )
            return
        elapsed = time.monotonic() - self.t0
        eta = elapsed / self.done * (self.total - self.done)
        note = "" if record.status == "ok" else f": {record.error}"
        line = f"[{self.done}/{self.total}] {record.status:7s} {spec.run_id} "
        line += f"({record.duration_s:.1f}s, ETA {eta:.0f}s){note}{_disturbed_note(record)}"
        print(line, file=sys.stderr, flush=True)

    def rerun(self, specs: list[RunSpec], attempt: int, limit: int) -> None:
        """``--rerun-disturbed``: these runs go again; the bar grows by as many."""
        self.total += len(specs)
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, total=self.total)
        ids = ", ".join(s.run_id for s in specs)
        say = self.progress.console.print if self.progress is not None else err.print
        say(f"rerun {attempt} of at most {limit}: {len(specs)} disturbed runs measured again "
            f"(earlier files in RUN/attempts/): {escape(ids)}")  # fmt: skip


def _disturbed_note(record: RunRecord) -> str:
    """`` disturbed: other processes used 1.31 cores ...`` when the rule says so, else ""."""
    if record.status != "ok" or not interference.disturbed(record.interference):
        return ""
    return f" disturbed: {interference.describe(record.interference)}"


class _progress:
    def __init__(self, total: int) -> None:
        self.total = total
        self.progress: Progress | None = None
        if err.is_terminal:
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err,
            )  # fmt: skip

    def __enter__(self) -> _Ticker:
        if self.progress:
            self.progress.__enter__()
        return _Ticker(self.total, self.progress)

    def __exit__(self, *exc: object) -> None:
        if self.progress:
            self.progress.__exit__(None, None, None)


def _print_outcome(summary: sweep_mod.SweepSummary) -> None:
    ran = len(summary.statuses)
    failed = summary.failed
    unavailable = len(summary.unavailable)
    ok = ran - len(failed) - unavailable
    skipped = f"{unavailable} skipped (prerequisites missing), " if unavailable else ""
    err.print(f"done: {ok} ok, {len(failed)} not ok, {skipped}{summary.skipped} skipped "
              f"(already complete); results in {summary.out}")  # fmt: skip
    if failed:
        err.print(f"not ok: {', '.join(failed)}; details in their run.json and stderr.log")
    if summary.kept_failed:
        err.print(f"{summary.kept_failed} runs failed in an earlier sweep and were not redone; "
                  "`qbench sweep --retry-failed` redoes them")  # fmt: skip
    _print_reruns(summary)
    err.print(f"next: qbench report {summary.out}")


def _print_reruns(summary: sweep_mod.SweepSummary) -> None:
    """What ``--rerun-disturbed`` did: how many runs went again and which are still
    disturbed (the report flags them and leaves them out of its verdicts)."""
    if not summary.reruns:
        return
    still = summary.still_disturbed
    clean = len(summary.reruns) - len(still)
    err.print(f"rerun: {len(summary.reruns)} disturbed runs measured again, {clean} now clean"
              + (f"; still disturbed: {', '.join(still)}" if still else ""))  # fmt: skip


# qbench.api runs a sweep as ``sweep`` above does, printing only progress.
progress = _progress
