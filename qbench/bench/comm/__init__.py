"""Collective benchmark in the style of nccl-tests: a size sweep of one gradient aggregation.

For each backend x world size, ONE launch of ``qbench.bench.comm.worker`` (torchrun / mpirun,
or one network namespace per rank with ``bandwidth``) loops over sizes x schemes x compressors
and writes raw per-rank samples; everything below that turns them into numbers is pure.

Formulas (nccl-tests ``doc/PERFORMANCE.md``), with S the fp32 gradient size in bytes and t the
median over timed repeats of the max over ranks of one ``aggregate()`` call:

* algbw = S / t: fp32-equivalent algorithmic bandwidth, whatever the scheme sends;
* busbw = algbw * 2 (K-1) / K (``busbw_factor("allreduce", K)``): every scheme computes the
  mean, i.e. an allreduce, so fp32 schemes compare with nccl-tests' all_reduce_perf directly;
* wire_busbw = wire bytes / t, the wire bytes being ``Comm.bytes_sent`` of the busiest rank (for
  fp32 allreduce that is 2 (K-1) / K * S, so wire_busbw = busbw);
* ideal speedup over fp32 allreduce = 32 / bits per value on the wire (32 / (bits + 32 /
  bucket_size) for qsgd through reduce-broadcast): the ratio of bytes, when only bytes count.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from qbench import catalog
from qbench.bench.comm.results import (  # noqa: F401  # the bench's public numbers
    TARGETS,
    CommRow,
    Speedup,
    Target,
    TargetResult,
    algbw,
    busbw,
    crossover,
    crossovers,
    ideal_speedup,
    over_ranks,
    speedups,
    summarize,
    targets,
)
from qbench.catalog import specs
from qbench.errors import UserError
from qbench.launch import local, machine, netns, shaped
from qbench.records.store import STDERR_LOG, STDOUT_LOG, strict_json
from qbench.spec import network, rules
from qbench.spec.network import Link

SCHEMA = "qbench.bench.comm/1"
WORKER_MODULE = "qbench.bench.comm.worker"
DEFAULT_COMPRESSORS = ("none", "fp16", "qsgd:bits=4,bucket_size=512")
BASELINE = ({"name": "allreduce"}, {"name": "none"})
"""fp32 allreduce: the reference of every speedup (added to the sweep when not requested)."""
LAUNCH_TIMEOUT_S = 3600.0
SYNC_MODES = ("barrier", "stream")
"""How timed calls start (``Settings.sync``)."""
MAX_GAP_MS = 10_000.0
POLL_S = 0.2
COPIES_PER_RANK = 10  # gradient, work copy, float64 mean and error, payloads: peak per rank
_COMBO = ("backend", "world_size", "network", "scheme", "compressor")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
_BYTES = re.compile(r"^(\d+)\s*([KMG]?)(?:I?B)?$")


# -- settings ------------------------------------------------------------------------------------
def parse_bytes(text: str, option: str) -> int:
    """``8`` / ``64K`` / ``256M`` / ``1G`` (binary units, as nccl-tests) -> bytes."""
    m = _BYTES.match(str(text).strip().upper())
    if not m or int(m.group(1)) == 0:
        raise UserError(f"{option} must be a byte count like 8, 64K, 256M or 1G, got {text!r}")
    nbytes = int(m.group(1)) * _UNITS[m.group(2)]
    if nbytes % 4:
        raise UserError(f"{option} is an fp32 gradient size: a multiple of 4 bytes, got {text!r}")
    return nbytes


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min, min*f, min*f^2, ... up to max, and max itself when the series steps over it (so
    ``--max-bytes 64M`` is always measured)."""
    if max_bytes < min_bytes:
        raise UserError(f"--max-bytes ({max_bytes}) is below --min-bytes ({min_bytes})")
    if factor < 2:
        raise UserError(f"--step-factor must be >= 2, got {factor}; e.g. `--step-factor 4`")
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    return sizes if sizes[-1] == max_bytes else [*sizes, max_bytes]


@dataclass(frozen=True, kw_only=True)
class Settings:
    backends: tuple[str, ...]
    world_sizes: tuple[int, ...]
    schemes: tuple[dict[str, Any], ...]
    """Scheme specs {"name": ..., params}; validated."""
    compressors: tuple[dict[str, Any], ...]
    sizes: tuple[int, ...]
    """fp32 gradient sizes in bytes."""
    repeats: int
    warmup: int
    bandwidth: str | None = None
    """Emulated link rate (e.g. ``1gbit``), None = unshaped."""
    sync: str = "barrier"
    """``barrier`` before every timed call, or ``stream``: calls back to back, as in training."""
    gap_ms: float = 0.0
    """Milliseconds of busy CPU before every call (a training step's compute; the link idles)."""

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise UserError(
                f"need --repeats >= 1 and --warmup >= 0, got {self.repeats}, "
                f"{self.warmup}; e.g. `--repeats 5 --warmup 2`"
            )
        if min(self.world_sizes) < 2:
            raise UserError(
                f"world sizes must be >= 2 (one rank sends nothing), got "
                f"{min(self.world_sizes)}; e.g. `--world-size 2 4`"
            )
        _ = self.link  # the rate checked here, before anything starts
        if not (math.isfinite(self.gap_ms) and 0 <= self.gap_ms <= MAX_GAP_MS):
            raise UserError(
                f"--gap-ms {self.gap_ms}: need 0 <= gap <= {MAX_GAP_MS:g} ms; e.g. `--gap-ms 10`"
            )
        if self.sync not in SYNC_MODES:
            raise UserError(
                f"--sync {self.sync!r}: valid: {', '.join(SYNC_MODES)}; e.g. `--sync stream`"
            )

    @cached_property
    def link(self) -> Link:
        """The emulated link (its rate parsed once); ``bandwidth`` stays the option as given."""
        return network.link({} if self.bandwidth is None else {"bandwidth": self.bandwidth})

    @property
    def network(self) -> str:
        return self.link.label


def settings(
    *, backends: Sequence[str], world_sizes: Sequence[int], schemes: Sequence[str],
    compressors: Sequence[str], min_bytes: str, max_bytes: str, step_factor: int, repeats: int,
    warmup: int, bandwidth: str | None, sync: str = "barrier", gap_ms: float = 0.0,
) -> Settings:  # fmt: skip
    """Settings from command-line strings; every bad value raises UserError naming it."""
    # Default: every registered scheme; ``plan`` skips those without a mean (with a note).
    scheme_specs = [specs.parse_cli(s, "scheme") for s in schemes] or [
        {"name": n} for n in catalog.SCHEMES
    ]
    for s in scheme_specs:
        catalog.scheme(s)
    comp_specs = [specs.parse_cli(c) for c in compressors or DEFAULT_COMPRESSORS]
    for c in comp_specs:
        catalog.compressor(c)
    sizes = sweep_sizes(
        parse_bytes(min_bytes, "--min-bytes"), parse_bytes(max_bytes, "--max-bytes"), step_factor
    )
    return Settings(
        backends=tuple(dict.fromkeys(backends or ("gloo",))),
        world_sizes=tuple(dict.fromkeys(world_sizes or (2,))), schemes=tuple(scheme_specs),
        compressors=tuple(comp_specs), sizes=tuple(sizes), repeats=repeats, warmup=warmup,
        bandwidth=bandwidth, sync=sync, gap_ms=gap_ms,
    )  # fmt: skip


def _params(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "name"}


def scheme_label(spec: dict[str, Any]) -> str:
    """``reduce-broadcast`` / ``reduce-broadcast+overlap4``, as in run labels."""
    return catalog.scheme_label(spec["name"], _params(spec))


def plan(
    backend: str, schemes: Sequence[dict[str, Any]], compressors: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The (scheme, compressor) combinations one backend runs, and why the others do not."""
    combos: list[dict[str, Any]] = []
    notes: list[str] = []
    parsed = [(c, catalog.compressor(c)) for c in compressors]  # the settings' JSON mappings
    for s in schemes:
        for c, spec in parsed:
            what = f"{backend} {scheme_label(s)} {spec.label}"
            why = rules.incompatibility(
                backend, s["name"], spec, params=_params(s), collective=True
            )
            if why:
                notes.append(f"skipped {what}: {why}")
            else:
                combos.append({"scheme": dict(s), "compressor": dict(c)})
    base = {"scheme": BASELINE[0], "compressor": BASELINE[1]}
    if base not in combos:
        combos.insert(0, base)
        notes.append(f"added {backend} allreduce fp32: the baseline of every speedup")
    return combos, notes


# -- measuring -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CommResult:
    settings: Settings
    rows: list[CommRow]
    notes: list[str]
    failures: list[str]
    """Launches that did not finish (their rows so far are kept)."""


def measure(s: Settings, on_progress: Callable[[str], None] | None = None) -> CommResult:
    """One launch per backend x world size; returns every row measured."""
    _check_machine(s)
    rows: list[CommRow] = []
    notes: list[str] = []
    failures: list[str] = []
    for backend in s.backends:
        combos, why = plan(backend, s.schemes, s.compressors)
        notes += why
        for k in s.world_sizes:
            got, failed = _launch(s, backend, k, combos, on_progress or (lambda _: None))
            rows += [summarize(r, s.network) for r in got if "skipped" not in r]
            notes += [f"skipped {backend} w{k} {r['scheme']} {r['compressor']} at {r['bytes']} "
                      f"B: {r['skipped']}" for r in got if "skipped" in r]  # fmt: skip
            failures += [failed] if failed else []
    return CommResult(s, rows, notes, failures)


def _check_machine(s: Settings) -> None:
    local.check_available(s.backends, max(s.world_sizes))
    if s.link.shaped:
        for b in s.backends:
            if why := rules.emulation_problem(b):
                raise UserError(why)
        netns.check_available()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = COPIES_PER_RANK * max(s.sizes) * max(s.world_sizes)
    if need > 0.8 * total:
        raise UserError(
            f"--max-bytes {max(s.sizes)} with {max(s.world_sizes)} ranks needs about "
            f"{need / 2**30:.1f} GiB, this machine has {total / 2**30:.1f}; lower --max-bytes"
        )


def _launch(
    s: Settings, backend: str, k: int, combos: list[dict[str, Any]],
    on_progress: Callable[[str], None],
) -> tuple[list[dict[str, Any]], str | None]:  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix=f"qbench-bench-comm-{backend}-w{k}-"))
    rows_path = workdir / "rows.jsonl"
    config = {
        "backend": backend, "sizes": list(s.sizes), "combos": combos, "repeats": s.repeats,
        "warmup": s.warmup, "rows_path": str(rows_path), "timeout_s": LAUNCH_TIMEOUT_S,
        "sync": s.sync, "gap_s": s.gap_ms / 1e3,
    }  # fmt: skip
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config, indent=2))
    on_progress(
        f"launching {backend}, {k} ranks, {s.network}: {len(s.sizes)} sizes x "
        f"{len(combos)} combinations"
    )
    seen = [0]
    report = lambda: _report_new(rows_path, seen, on_progress)  # noqa: E731
    if s.link.bits_per_s is None:
        status, code = _run_local(_local_argv(backend, config_path, k), workdir, report)
    else:
        program = [sys.executable, "-m", WORKER_MODULE, str(config_path)]
        star = network.Topology(nodes=k, ranks_per_node=1, inter=s.link)  # a host per rank
        status, code = shaped.run_program(backend, star, program, workdir, LAUNCH_TIMEOUT_S)
    report()
    got = _read_rows(rows_path)
    if status == "ok":
        shutil.rmtree(workdir, ignore_errors=True)
        return got, None
    last = (workdir / STDERR_LOG).read_text(errors="replace").strip().splitlines()[-1:]
    return got, f"{backend} w{k}: {status} (exit {code}) {''.join(last)!r}; logs in {workdir}"


def _local_argv(backend: str, config_path: Path, k: int) -> list[str]:
    """The launcher's argv with the bench worker in place of the training worker."""
    argv = local.argv_for(backend, config_path, k)
    i = len(argv) - len(local.WORKER) - 1
    assert argv[i:-1] == local.WORKER, argv
    return [*argv[:i], "-m", WORKER_MODULE, str(config_path)]


def _run_local(
    argv: list[str], workdir: Path, report: Callable[[], None]
) -> tuple[str, int | None]:
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    with open(workdir / STDOUT_LOG, "wb") as out, open(workdir / STDERR_LOG, "wb") as err:
        # Own process group, so a timeout or Ctrl-C kills the launcher and every rank together.
        proc = subprocess.Popen(
            argv, stdout=out, stderr=err, env=local.worker_env(), start_new_session=True
        )
        try:
            while (code := proc.poll()) is None:
                if time.monotonic() > deadline:
                    return "timeout", None
                report()
                time.sleep(POLL_S)
        finally:
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return ("ok" if code == 0 else "failed"), code


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """Complete lines only: rank 0 may be writing the last one."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


def _report_new(path: Path, seen: list[int], on_progress: Callable[[str], None]) -> None:
    rows = _read_rows(path)
    for r in rows[seen[0] :]:
        what = f"{r['backend']} w{r['world_size']} {r['bytes']} B {r['scheme']} {r['compressor']}"
        if "skipped" in r:
            on_progress(f"{what}: skipped")
        else:
            t = statistics.median(over_ranks(r["rank_samples"])[r["warmup"] :])
            on_progress(f"{what}: {t * 1e3:.3f} ms, rel_error {r['rel_error']:.2g}")
    seen[0] = len(rows)


# -- output --------------------------------------------------------------------------------------
def to_document(result: CommResult) -> dict[str, Any]:
    """The JSON document for ``--json``: schema, provenance, settings, rows and summaries."""
    ups = speedups(result.rows)
    doc = {
        "schema": SCHEMA,
        "machine": machine.collect(),
        "versions": machine.versions(),
        "git_commit": machine.git_commit(),
        "settings": {**asdict(result.settings), "network": result.settings.network},
        "notes": result.notes,
        "failures": result.failures,
        "rows": [asdict(r) for r in result.rows],
        "speedups": [asdict(u) for u in ups],
        "crossovers": [
            dict(zip(_COMBO, k, strict=True), bytes=v) for k, v in crossovers(ups).items()
        ],
        "targets": [
            {
                **asdict(t),
                "target": t.target.describe(),
                "fraction": t.fraction,
                "passed": t.passed,
            }
            for t in targets(result.rows)
        ],
    }
    return strict_json(doc)  # NaN: phases of overlapped schemes
