"""What the CLI commands do, printed for people: tables, progress bars, one-line outcomes."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

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

from qbench.records.schema import RunRecord
from qbench.spec import checks
from qbench.spec import matrix as matrix_mod
from qbench.spec import scenario as scenario_mod
from qbench.spec.matrix import Matrix
from qbench.spec.runspec import RunSpec

if TYPE_CHECKING:
    from qbench.launch import preflight
    from qbench.launch.sweep import SweepSummary

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
        from qbench.errors import UserError

        raise UserError(f"results directory {target} exists and is not a directory; pick "
                        "another --out")  # fmt: skip
    from qbench.launch import preflight

    try:
        m = matrix_mod.expand(sc)
    except checks.EmptyMatrix as e:
        if dry_run:  # the exclusions are the answer: show them, then the one-line error
            _print_matrix(Matrix([], e.excluded), target, preflight.check([]))
        raise
    from qbench.launch import decision
    from qbench.launch import sweep as sweep_mod

    launch = decision.launch_for(sc, launcher, m, isolation)
    if dry_run:
        verdicts = preflight.check(m.runs, launch=launch)
        _print_matrix(m, target, verdicts)
        if factories(m):
            err.print("note: --dry-run does not import model, dataset or loss factories; a "
                      "sweep imports and checks them before the first run")  # fmt: skip
        return
    if factories(m):  # the user's code: imported and tried once here, before any run starts
        from qbench.run import workload

        workload.preflight(m.runs)
    from qbench.records.store import ResultStore

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
    from qbench.records import interference

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


def _print_outcome(summary: SweepSummary) -> None:
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


def _print_reruns(summary: SweepSummary) -> None:
    """What ``--rerun-disturbed`` did: how many runs went again and which are still
    disturbed (the report flags them and leaves them out of its verdicts)."""
    if not summary.reruns:
        return
    still = summary.still_disturbed
    clean = len(summary.reruns) - len(still)
    err.print(f"rerun: {len(summary.reruns)} disturbed runs measured again, {clean} now clean"
              + (f"; still disturbed: {', '.join(still)}" if still else ""))  # fmt: skip


def report(
    directory: Path, fmt: str, include_disturbed: bool = False, kernels: str | None = None,
    figures: bool = True,
) -> None:  # fmt: skip
    from qbench.report import tables as report_mod

    paths = report_mod.write_report(directory, fmt, include_disturbed=include_disturbed,
                                    kernels=kernels, figures=figures)  # fmt: skip
    for note in paths.notes:
        err.print(note)
    if fmt != "table":  # the table prints them under itself
        from qbench.report import disturbed

        for warning in disturbed.warnings(paths.summary):
            err.print(f"warning: {escape(warning)}")
    drawn = ", ".join(p.name for p in paths.figures) or "none"
    drawn += "" if figures else " (--no-figures)"
    err.print(f"report: {paths.summary_md} and {paths.summary_csv.name}; figures: {drawn} "
              f"(in {paths.summary_md.parent})")  # fmt: skip


def compare(
    a: Path, b: Path, fmt: str, fail_pct: float | None = None, include_disturbed: bool = False
) -> None:
    """``report A B``; with ``fail_pct`` exit 1 when a configuration regressed beyond noise."""
    from qbench.report import ab_report as report_mod
    from qbench.report import ab_stats as compare_mod

    csv_path, md_path, frame = report_mod.write_comparison(
        a, b, fmt, include_disturbed=include_disturbed
    )
    counts = ", ".join(f"{n} {v}" for v, n in frame["verdict"].value_counts().items())
    err.print(f"comparison: {counts}; written to {md_path} and {csv_path.name}")
    few = report_mod.compare_few_runs(frame)
    if few:
        err.print(f"warning: {escape(few)}")
    left = frame[["a_disturbed", "b_disturbed"]].fillna(0).sum()
    if left.any():
        err.print(f"warning: disturbed runs left out ({int(left['a_disturbed'])} of A, "
                  f"{int(left['b_disturbed'])} of B; listed in {md_path.name}); "
                  "--include-disturbed compares them")  # fmt: skip
    if fail_pct is None:
        return
    slow = compare_mod.regressions(frame, fail_pct)
    for r in slow.to_dict("records"):
        err.print(f"slower: {r['model']} {r['backend']} {r['scheme']} {r['compressor']} "
                  f"{r['world_size']} ranks {r['network']}: B/A {r['ratio']:.3f} "
                  f"(95 % interval {r['ci_low']:.3f}-{r['ci_high']:.3f})")  # fmt: skip
    if len(slow):
        err.print(f"fail: {len(slow)} configurations slower by more than {fail_pct:g} % "
                  "beyond the noise (--fail-if-slower)")  # fmt: skip
        sys.exit(1)
    err.print(f"pass: no configuration slower by more than {fail_pct:g} % beyond the noise")


def models() -> None:
    from qbench import models as zoo
    from qbench.catalog.model_params import human, significant

    t = Table(title="model zoo (forward GFLOPs per sample: 2 per multiply-add)")
    for col in ("name", "parameters", "grad MB fp32", "GFLOPs/sample", "input", "classes"):
        t.add_column(col, justify="left" if col in ("name", "input") else "right")
    t.add_column("seed")
    t.add_column("description")
    for m in zoo.MODELS.values():
        n = zoo.parameter_count(m.name)
        shape = "x".join(map(str, m.input_shape))
        if not m.input_dtype.is_floating_point:
            shape += f" tokens < {m.vocab_size:,}"
        gflops = zoo.flops_per_sample(m.name) / 1e9
        t.add_row(
            m.name, human(n), significant(n * 4 / 1e6), significant(gflops), shape,
            f"{m.num_classes:,}", m.source, m.description,
        )  # fmt: skip
    out.print(t)
    takes = [name for name, e in zoo.MODELS.items() if e.params]
    out.print(
        f"{', '.join(takes[:-1])} and {takes[-1]} take parameters, e.g. model: "
        "{name: synthetic, params: 25M, gflops: 0.5}; the rows show their defaults."
    )


def info() -> None:
    from qbench.catalog import plugins
    from qbench.launch import machine

    t = Table(title="qbench info")
    t.add_column("what")
    t.add_column("status")
    for what, status in [*machine.capabilities(), *plugins.info_rows()]:
        t.add_row(what, escape(status))  # reasons quote `qbench[cuda12]`: not rich markup
    out.print(t)


# qbench.api runs a sweep as ``sweep`` above does, printing only progress.
progress = _progress
