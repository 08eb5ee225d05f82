"""How much error a wire format adds to the averaged gradient, per reduction order, at K
simulated ranks (one process; no torch.distributed): ``qbench bench numerics``.

For K = 2 .. 1024 the rows of a gradient source stand for the ranks' float32 gradients (real
ones: a zoo model's on its own mini-batch per rank, ``qbench.run.gradients``, or rows of a saved
tensor); every compressor x every order of ``qbench.bench.numerics.orders`` turns them into
the averaged gradient, which is compared in float64 with the float64 mean of the rows:

* relative error ||est - mean|| / ||mean|| and cosine similarity, one sample per repeat;
* bias: ||mean over repeats of (est - mean)||, kept raw (``bias_norm``); over the mean of
  ||mean||, it still holds noise / sqrt(R) of the repeats, so the summary puts the noise floor
  (rms relative error / sqrt(R)) beside it (``qbench.report.numerics``).

Each repeat draws fresh gradients (a file's rows are the same every repeat) and builds every
codec with seed = repeat. Every raw sample is kept; nothing here prints (progress goes to
``on_progress``) or summarises: the summary and tables read the document (``to_document``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from qbench import catalog, compress
from qbench.bench.numerics import orders
from qbench.bench.numerics.gradients import GradientSource
from qbench.catalog import specs
from qbench.compress import integer_sum
from qbench.errors import UserError, choice_error
from qbench.launch import machine
from qbench.records.store import strict_json

SCHEMA = "qbench.bench.numerics/1"
SIMULATED = "simulated ranks (one process)"
MIN_RANKS, MAX_RANKS = 2, 1024
DEFAULT_RANKS = tuple(2**i for i in range(1, 11))
DEFAULT_NUMEL = 4096
DEFAULT_REPEATS = 5
DEFAULT_MAX_CALLS = 4096
"""Encode calls one sample may make: a codec that scales per call (or per tensor) needs about
K^2 in ring and alltoall (one per chunk per hop), which this caps (K <= 64 by default)."""
MAX_OFFSET = 1 << 32
"""Draws are keyed by a 32-bit element index: K x numel must stay below it."""
ORDERS = tuple(orders.ORDERS)
# The formats compared: the fp32 sanity row, the 16-bit casts, QSGD and the FP8 / MX / NVFP4
# wire formats; one not registered (a tree without them) is skipped with a note.
DEFAULT_SPECS = (
    "none", "fp16", "bf16", "qsgd:bits=8", "fp8:format=e4m3", "fp8:format=e5m2",
    "mx:element=e4m3", "mx:element=e3m2", "mx:element=e2m1", "nvfp4",
)  # fmt: skip


# -- settings ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Settings:
    specs: tuple[str, ...]
    """``NAME[:KEY=VALUE,...]`` as given; empty: DEFAULT_SPECS, absent ones skipped."""
    ranks: tuple[int, ...]
    """Simulated world sizes K, ascending."""
    orders: tuple[str, ...]
    repeats: int
    numel: int
    """Gradients are cut to their first ``numel`` values (0: whole)."""
    max_calls: int = DEFAULT_MAX_CALLS
    threads: int = 1
    """torch intra-op threads while simulating (restored afterwards)."""


def settings(
    *, specs: Sequence[str] = (), ranks: Sequence[int] = DEFAULT_RANKS,
    orders: Sequence[str] = (), repeats: int = DEFAULT_REPEATS, numel: int = DEFAULT_NUMEL,
    max_calls: int = DEFAULT_MAX_CALLS, threads: int = 1,
) -> Settings:  # fmt: skip
    """Checked settings; UserError naming a bad value and a fix."""
    for k in ranks:
        if isinstance(k, bool) or not isinstance(k, int) or not MIN_RANKS <= k <= MAX_RANKS:
            raise UserError(
                f"ranks must be integers {MIN_RANKS}..{MAX_RANKS} (simulated in one process), "
                f"got {k!r}; e.g. `--ranks 2 16 256`"
            )
    for name in orders:
        if name not in ORDERS:
            raise choice_error("order", name, ORDERS)
    _at_least("repeats", repeats, 1, "--repeats 5")
    _at_least("numel", numel, 0, f"--numel {DEFAULT_NUMEL} (0: the whole gradient)")
    _at_least("max calls", max_calls, 1, f"--max-calls {DEFAULT_MAX_CALLS}")
    _at_least("threads", threads, 1, "--threads 1")
    return Settings(
        specs=tuple(specs), ranks=tuple(sorted(set(ranks or DEFAULT_RANKS))),
        orders=tuple(dict.fromkeys(orders or ORDERS)), repeats=repeats, numel=numel,
        max_calls=max_calls, threads=threads,
    )  # fmt: skip


def _at_least(what: str, value: int, least: int, example: str) -> None:
    if value < least:
        raise UserError(f"{what} must be >= {least}, got {value}; e.g. `{example}`")


def resolve(given: Sequence[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The compressor specs to compare (checked mappings); defaults not in the catalog, or not
    buildable, become notes. A spec asked for must build: a typo fails naming the valid ones."""
    found: list[dict[str, Any]] = []
    notes: list[str] = []
    for text in given or DEFAULT_SPECS:
        spec = specs.parse_cli(text)
        if given:
            _build(spec, 0)  # UserError now, before any gradient is computed
        elif spec["name"] not in catalog.COMPRESSORS:
            notes.append(f"skipped {text}: {spec['name']!r} is not registered")
            continue
        else:
            try:
                _build(spec, 0)
            except UserError as e:
                notes.append(f"skipped {text}: {e}")
                continue
        found.append(spec)
    return found, notes


def _build(spec: dict[str, Any], seed: int) -> compress.Compressor:
    comp = compress.from_spec(spec, seed=seed)
    if comp.hook_only:
        raise UserError(
            f"{comp.label} is a DDP communication hook, not a codec; pick a codec, e.g. "
            "`--compressor qsgd:bits=8`"
        )
    return comp


def check_source(source: GradientSource, s: Settings) -> None:
    """UserError when the source has fewer rows than the most ranks asked for, or when K x
    numel values outgrow the draws' 32-bit element index."""
    k = max(s.ranks)
    if source.rows is not None and k > source.rows:
        raise UserError(
            f"--ranks {k} needs {k} gradient rows, the gradients file has {source.rows}; use "
            f"--ranks up to {source.rows} or save more rows"
        )
    if k * source.numel >= MAX_OFFSET:
        raise UserError(
            f"{k} ranks x {source.numel} values is over 2^32 values, the draws' index; use "
            f"--numel up to {(MAX_OFFSET - 1) // k}"
        )


# -- results -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Sample:
    repeat: int
    rel_error: float
    """||est - mean|| / ||mean||, float64."""
    cosine: float
    error_norm: float
    mean_norm: float
    """||mean||: the float64 mean of the ranks' gradients."""
    seconds: float
    """Wall time of simulating this order once."""


@dataclass(kw_only=True)
class NumericsRow:
    compressor: str
    """Label, e.g. ``qsgd-8b-b512``."""
    spec: dict[str, Any]
    order: str
    ranks: int
    numel: int
    status: str = "ok"
    """``ok``, or ``n/a`` with ``reason``."""
    reason: str = ""
    calls: int = 0
    """Encode calls per sample (one per message a rank sends)."""
    samples: list[Sample] = field(default_factory=list)
    bias_norm: float = float("nan")
    """||mean over repeats of (est - mean)||."""


@dataclass(frozen=True)
class NumericsResult:
    settings: Settings
    source: dict[str, Any]
    rows: list[NumericsRow]
    notes: list[str]
    seconds: float
    """Wall time of the whole simulation, gradients included."""


# -- the simulation ------------------------------------------------------------------------------
def _integer_sum(comp: compress.Compressor) -> tuple[integer_sum.IntegerSum | None, str]:
    """(its integer view, "") or (None, why the integer order cannot sum this codec)."""
    view = integer_sum.for_compressor(comp)
    if view is not None:
        return view, ""
    why = comp.spec.entry.integer_levels(comp.spec.params) or "qbench.compress.integer_sum has none"
    return None, f"{comp.label} has no integer view: {why}"


def _skip_reason(comp: compress.Compressor, order: str, k: int, max_calls: int) -> str:
    per_call = orders.grid(comp) is None
    need = orders.calls(order, k, per_call)
    if need > max_calls:
        return (
            f"{comp.label} scales per {comp.granularity}: {order} at {k} ranks needs {need} "
            f"encode calls, over --max-calls {max_calls}; raise it to run them"
        )
    return "" if order != "integer" else _integer_sum(comp)[1]


def _estimate(comp: compress.Compressor, order: str, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    if order == "integer":
        view, _ = _integer_sum(comp)
        assert view is not None
        return orders.integer(view, x, comp.seed), x.shape[0]
    rt = orders.Rounder(comp)
    run = orders.ORDERS[order]
    assert run is not None
    return run(rt, x), rt.calls


def sample(est: torch.Tensor, mean: torch.Tensor, repeat: int, seconds: float
           ) -> tuple[Sample, torch.Tensor]:  # fmt: skip
    """One repeat's metrics of ``est`` against the float64 ``mean``, and the error est - mean
    (float64) that the bias sums (also benchmarks/mx_ring_saturation.py's)."""
    e = est.double()
    err = e - mean
    mean_norm, err_norm = float(mean.norm()), float(err.norm())
    cos = float(e @ mean) / (float(e.norm()) * mean_norm) if mean_norm else float("nan")
    rel = err_norm / mean_norm if mean_norm else float("nan")
    return Sample(repeat=repeat, rel_error=rel, cosine=cos, error_norm=err_norm,
                  mean_norm=mean_norm, seconds=seconds), err  # fmt: skip


class _Rows:
    """The rows in (compressor, order, K) order, with the running sum of errors over repeats."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, str, int], NumericsRow] = {}
        self.errors: dict[tuple[int, str, int], torch.Tensor] = {}

    def row(self, key: tuple[int, str, int], comp: compress.Compressor, numel: int) -> NumericsRow:
        if key not in self.rows:
            self.rows[key] = NumericsRow(
                compressor=comp.label, spec={"name": comp.name, **comp.spec.params},
                order=key[1], ranks=key[2], numel=numel,
            )  # fmt: skip
        return self.rows[key]

    def add(self, key: tuple[int, str, int], sample: Sample, err: torch.Tensor, calls: int) -> None:
        self.rows[key].samples.append(sample)
        self.rows[key].calls = calls
        self.errors[key] = err if key not in self.errors else self.errors[key].add_(err)

    def finish(self) -> list[NumericsRow]:
        for key, total in self.errors.items():
            row = self.rows[key]
            row.bias_norm = float(total.norm()) / len(row.samples)
        ordered = sorted(self.rows, key=lambda key: (key[0], ORDERS.index(key[1]), key[2]))
        return [self.rows[key] for key in ordered]


def measure(
    s: Settings, source: GradientSource, on_progress: Callable[[str], None] | None = None
) -> NumericsResult:
    """Every compressor x order x K x repeat of ``s`` on ``source``'s gradients."""
    check_source(source, s)
    found, notes = resolve(s.specs)
    say = on_progress or (lambda what: None)
    previous = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    start = time.perf_counter()
    try:
        rows = _simulate(s, source, found, say)
    finally:
        torch.set_num_threads(previous)
    return NumericsResult(s, source.describe(), rows, notes, time.perf_counter() - start)


def _simulate(
    s: Settings, source: GradientSource, found: list[dict[str, Any]], say: Callable[[str], None]
) -> list[NumericsRow]:
    acc = _Rows()
    for repeat in range(s.repeats):
        t0 = time.perf_counter()
        say(f"repeat {repeat + 1}/{s.repeats}: gradients of {max(s.ranks)} {SIMULATED}")
        grads = source.gradients(repeat, max(s.ranks))
        say(f"repeat {repeat + 1}/{s.repeats}: gradients took {time.perf_counter() - t0:.1f} s")
        comps = [_build(spec, repeat) for spec in found]
        for k in s.ranks:
            x = grads[:k]
            mean = x.double().sum(0) / k
            say(f"repeat {repeat + 1}/{s.repeats}, K = {k}: {len(comps)} formats x "
                f"{len(s.orders)} orders")  # fmt: skip
            for i, comp in enumerate(comps):
                for order in s.orders:
                    key = (i, order, k)
                    row = acc.row(key, comp, x.shape[1])
                    reason = _skip_reason(comp, order, k, s.max_calls)
                    if reason:
                        row.status, row.reason = "n/a", reason
                        continue
                    t1 = time.perf_counter()
                    est, calls = _estimate(comp, order, x)
                    one, err = sample(est, mean, repeat, time.perf_counter() - t1)
                    acc.add(key, one, err, calls)
    return acc.finish()


# -- the document --------------------------------------------------------------------------------
def to_document(result: NumericsResult) -> dict[str, Any]:
    """The JSON document for ``--json``: schema, provenance, settings, the gradient source and
    every row with its raw samples (non-finite numbers as null)."""
    return strict_json({
        "schema": SCHEMA,
        "simulated": SIMULATED,
        "machine": machine.collect(),
        "versions": machine.versions(),
        "git_commit": machine.git_commit(),
        "settings": asdict(result.settings),
        "source": result.source,
        "orders": {name: orders.DESCRIPTIONS[name] for name in result.settings.orders},
        "seconds": result.seconds,
        "notes": result.notes,
        "rows": [asdict(r) for r in result.rows],
    })  # fmt: skip
