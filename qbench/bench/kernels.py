"""Encode/decode speed of each compressor against a plain ``dst.copy_(src)`` of the same tensor.

Per (compressor, size) the copy baseline is timed in the same loop as encode and decode, one
copy right before each encode/decode pair, so machine noise hits both alike; ``ratio`` is
seconds / copy_seconds. As the copy writes into a preallocated tensor, so does the decode
(``decode(payload, out, accumulate=False)``): a fresh output would add its page faults. Every
raw sample is kept; summaries are medians after one warm-up. torch's own casts (PEERS: fp32 to
float8_e4m3fn and to bfloat16 for encode, back to fp32 for decode, each into a preallocated
tensor as the copy is) are timed in the same loop, so a row says how the codec stands against
the kernels a user would otherwise reach for. Each row also places its op on
the roofline (``qbench.spec.roofline``: the bytes it must move at the copy bandwidth, and the
link rate below which compressing pays). Nothing here prints: see ``qbench.bench.render``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any, cast

import torch

from qbench import compress
from qbench.bench import interleave
from qbench.bench.interleave import PEERS  # noqa: F401 (render and callers read kernels.PEERS)
from qbench.catalog import specs
from qbench.errors import UserError
from qbench.launch import machine
from qbench.spec import codec_times, roofline

SCHEMA = codec_times.SCHEMA
OPS = codec_times.OPS
MIN_LOG2, MAX_LOG2 = 1, 26
DEFAULT_SIZES = (16, 20, 24)
DEFAULT_MAX_TIME = 5.0
"""Seconds of timed repeats per compressor and size."""

# The compressor families we compare; names not registered yet are skipped with a note.
DEFAULT_SPECS = (
    "none", "fp16", "bf16", "qsgd:bits=2,bucket_size=128", "qsgd:bits=4,bucket_size=512",
    "qsgd:bits=8,bucket_size=512", "qsgd:bits=16,bucket_size=8192", "onebit:bucket_size=64",
    "fp8:block_size=128", "mx:element=e4m3", "mx", "nvfp4", "fixedpoint:bits=8",
    "topk:ratio=0.01", "adaptive",
)  # fmt: skip


@dataclass(frozen=True)
class Target:
    """A speed goal from the issue tracker: each op at most ``max_ratio`` times a copy."""

    label: str
    log2_numel: int
    max_ratio: float
    ops: tuple[str, ...] = OPS

    def describe(self) -> str:
        goals = ", ".join(f"{op} <= {self.max_ratio:g}x copy" for op in self.ops)
        return f"{self.label} at 2^{self.log2_numel} {goals}"


# Issue 37 item 2, CPU kernels at the floor (one thread; QSGD 4-bit's floor is about 0.56x copy).
TARGETS = (
    Target(label="qsgd-4b-b512", log2_numel=24, max_ratio=0.8, ops=("encode",)),
    Target(label="qsgd-4b-b512", log2_numel=24, max_ratio=0.7, ops=("decode",)),
    Target(label="1bit-b64", log2_numel=24, max_ratio=1.0, ops=("encode",)),
)


@dataclass(frozen=True)
class TargetResult:
    target: Target
    ratios: dict[str, float]
    """Measured ratio per op of the target."""

    def passed(self, op: str) -> bool:
        return self.ratios[op] <= self.target.max_ratio


@dataclass(frozen=True, kw_only=True)
class KernelRow:
    compressor: str
    """Compressor label, e.g. ``qsgd-4b-b512``."""
    spec: dict[str, Any]
    """Name and parameters it was built from."""
    op: str
    numel: int
    device: str
    implementation: str
    """Code path that ran: ``torch`` unless the compressor says otherwise (e.g. ``native``)."""
    seconds: float
    """Median of the timed samples."""
    gbps: float
    """GB/s of input: float32 bytes per second, 4 * numel / seconds / 1e9 (roofline.input_gbps)."""
    copy_seconds: float
    """Median of the interleaved ``dst.copy_(src)`` samples."""
    ratio: float
    """seconds / copy_seconds ("x copy"): 1 / ratio is the op's input rate over copy's."""
    wire_bytes: int
    """Measured payload bytes (``Payload.nbytes``)."""
    bits_per_value: float
    roofline: roofline.Placement
    """The op against its memory floor, and the compressor's break-even link rates."""
    samples: list[float] = field(default_factory=list)
    copy_samples: list[float] = field(default_factory=list)
    peer_seconds: dict[str, float] = field(default_factory=dict)
    """Median seconds of each of PEERS in this op's direction, timed beside it."""
    peer_samples: dict[str, list[float]] = field(default_factory=dict)

    def peer_ratio(self, peer: str) -> float | None:
        """seconds / the peer's seconds ("x fp8 cast"), None when the peer was not timed."""
        s = self.peer_seconds.get(peer)
        return self.seconds / s if s else None


@dataclass(frozen=True)
class KernelResult:
    rows: list[KernelRow]
    notes: list[str]
    """Why default compressors were skipped."""
    device: str
    threads: int
    repeats: int
    sizes: tuple[int, ...]
    backend: str = "auto"
    """Code path requested (``qbench.compress.kernels.native``): auto, torch or native."""
    max_time: float = DEFAULT_MAX_TIME
    """Seconds of timed repeats per compressor and size (rows may hold fewer than repeats)."""
    overlap: float = roofline.DEFAULT_OVERLAP
    """Fraction of codec time hidden behind other work in ``breakeven_overlap_gbit``."""

    def targets(self) -> list[TargetResult]:
        """Targets whose rows were measured, with their ratios."""
        found = []
        for t in TARGETS:
            ratios = {
                r.op: r.ratio
                for r in self.rows
                if r.compressor == t.label and r.numel == 2**t.log2_numel and r.op in t.ops
            }
            if set(ratios) == set(t.ops):
                found.append(TargetResult(t, ratios))
        return found


# -- specs ---------------------------------------------------------------------------------------
parse_spec = specs.parse_cli  # ``qsgd:bits=4,bucket_size=512`` -> a spec mapping


def resolve(specs: Sequence[str] | None) -> tuple[list[compress.Compressor], list[str]]:
    """Build the compressors to measure; defaults not registered (or not buildable) become notes.

    Explicitly requested specs must build: a typo fails with the valid names.
    """
    built: list[compress.Compressor] = []
    notes: list[str] = []
    for text in specs or DEFAULT_SPECS:
        spec = parse_spec(text)
        params = {k: v for k, v in spec.items() if k != "name"}
        if specs:
            built.append(compress.build(spec["name"], **params))
        elif spec["name"] not in compress.COMPRESSORS:
            notes.append(f"skipped {text}: {spec['name']!r} is not registered")
        else:
            try:
                built.append(compress.build(spec["name"], **params))
            except UserError as e:
                notes.append(f"skipped {text}: {e}")
    return built, notes


def _native() -> ModuleType | None:
    """``qbench.compress.kernels.native`` (compiled kernels, backend switch) if the tree has it."""
    try:
        return importlib.import_module("qbench.compress.kernels.native")
    except ModuleNotFoundError:
        return None


def implementation(comp: compress.Compressor, t: torch.Tensor) -> str:
    """The code path ``comp`` takes for tensors like ``t``: ``native-cpu`` / ``native-cuda`` when
    its module dispatches through ``qbench.compress.kernels.native`` and a compiled path is
    selected, else ``torch``."""
    native = _native()
    uses_native = vars(sys.modules[type(comp).__module__]).get("native") is native
    if native is None or not uses_native:
        return "torch"
    try:
        kernels = native.kernels_for(t)
    except RuntimeError as e:  # backend 'native' forced where nothing is compiled
        raise UserError(f"{comp.label}: {e}; use `--backend auto` or `--backend torch`") from e
    return "torch" if kernels is None else f"native-{t.device.type}"


def _backend(name: str) -> AbstractContextManager[object]:
    """Select the compressor code path (auto / torch / native) while measuring."""
    native = _native()
    if native is not None:
        return cast(AbstractContextManager[object], native.backend(name))
    if name != "auto":
        raise UserError(f"backend {name!r} needs qbench.compress.kernels.native; use auto")
    return nullcontext()


def _rows(
    comp: compress.Compressor, src: torch.Tensor, repeats: int, max_time: float,
    clock: interleave.Clock,
    overlap: float,
) -> list[KernelRow]:  # fmt: skip
    impl = implementation(comp, src)
    times, copies, peer_times, payload = interleave.samples(comp, src, repeats, max_time, clock)
    numel, copy_s = src.numel(), interleave.median(copies)
    secs = {op: interleave.median(times[op]) for op in OPS}
    # The timed decode writes its values into a buffer (accumulate=False): nothing accumulates.
    placed = roofline.place(
        numel, secs, copy_s, wire_bytes=comp.spec.wire_bytes(numel), measured=payload.nbytes,
        error_feedback=comp.stateful, overlap=overlap,
    )  # fmt: skip
    return [
        KernelRow(
            compressor=comp.label, spec={"name": comp.name, **comp.spec.params}, op=op,
            numel=numel, device=str(src.device), implementation=impl, seconds=s,
            gbps=roofline.input_gbps(numel, s), copy_seconds=copy_s, ratio=s / copy_s,
            wire_bytes=payload.nbytes, bits_per_value=8 * payload.nbytes / numel,
            samples=times[op], copy_samples=copies, roofline=placed[op],
            peer_seconds={p: interleave.median(t) for p, t in peer_times[op].items()},
            peer_samples=peer_times[op],
        )
        for op, s in secs.items()
    ]  # fmt: skip


# -- entry ---------------------------------------------------------------------------------------
def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device 'cuda' requested but torch sees no CUDA GPU; use `--device cpu`")
    if name not in ("cpu", "cuda"):
        raise UserError(f"device must be 'cpu' or 'cuda', got {name!r}; e.g. `--device cpu`")
    return torch.device(name)


def _check(sizes: Sequence[int], repeats: int, threads: int, max_time: float) -> None:
    for e in sizes:
        if not MIN_LOG2 <= e <= MAX_LOG2:
            raise UserError(
                f"sizes are log2 of element counts, {MIN_LOG2}..{MAX_LOG2}, got {e}; "
                "e.g. `--sizes 16 20 24`"
            )
    if repeats < 1:
        raise UserError(f"repeats must be >= 1, got {repeats}; e.g. `--repeats 5`")
    if threads < 1:
        raise UserError(f"threads must be >= 1, got {threads}; e.g. `--threads 1`")
    if not max_time > 0:
        raise UserError(f"max time must be > 0 seconds, got {max_time}; e.g. `--max-time 5`")


def measure(
    specs: Sequence[str] | None = None,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 5,
    max_time: float = DEFAULT_MAX_TIME,
    device: str = "cpu",
    threads: int = 1,
    backend: str = "auto",
    overlap: float = roofline.DEFAULT_OVERLAP,
    on_progress: Callable[[str], None] | None = None,
) -> KernelResult:
    """Time encode and decode of every compressor on float32 tensors of 2^size elements.

    specs: ``NAME[:KEY=VALUE,...]`` strings; None means DEFAULT_SPECS (missing ones skipped).
    max_time: seconds of timed repeats per compressor and size; slower ones stop early (with at
        least one sample each; a row's ``samples`` says how many).
    threads: torch intra-op threads while measuring (1 = one CPU rank); restored afterwards.
    backend: compressor code path (``qbench.compress.kernels.native``; auto = compiled if built).
    overlap: fraction f of codec time hidden, 0 <= f < 1, for ``breakeven_overlap_gbit``.
    """
    _check(sizes, repeats, threads, max_time)
    roofline.check_overlap(overlap)
    dev = _device(device)
    comps, notes = resolve(specs)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with _backend(backend):
            rows = _measure_all(comps, sizes, repeats, max_time, dev, overlap, on_progress)
    finally:
        torch.set_num_threads(previous)
    return KernelResult(
        rows, notes, dev.type, threads, repeats, tuple(sizes), backend, max_time, overlap
    )


def _measure_all(
    comps: list[compress.Compressor], sizes: Sequence[int], repeats: int, max_time: float,
    dev: torch.device, overlap: float, on_progress: Callable[[str], None] | None,
) -> list[KernelRow]:  # fmt: skip
    clock = interleave.clock_for(dev)
    rows: list[KernelRow] = []
    for e in sizes:
        src = torch.randn(2**e, generator=torch.Generator(dev).manual_seed(e), device=dev)
        for comp in comps:
            if on_progress:
                on_progress(f"{comp.label} at 2^{e} on {dev.type}")
            rows += _rows(comp, src, repeats, max_time, clock, overlap)
            comp.reset()
    return rows


def to_document(result: KernelResult) -> dict[str, Any]:
    """The JSON document for ``--json``: schema, provenance, settings, rows, targets and the
    roofline (each size's copy bandwidth and the overlap of ``breakeven_overlap_gbit``)."""
    return {
        "schema": SCHEMA,
        "machine": machine.collect(),
        "versions": machine.versions(),
        "git_commit": machine.git_commit(),
        "device": result.device,
        "clock": interleave.describe(result.device),
        "threads": result.threads,
        "backend": result.backend,
        "repeats": result.repeats,
        "max_time": result.max_time,
        "sizes": list(result.sizes),
        "notes": result.notes,
        "rows": [asdict(r) for r in result.rows],
        "targets": [
            {
                "target": t.target.describe(),
                "ratios": t.ratios,
                "passed": {op: t.passed(op) for op in t.ratios},
            }
            for t in result.targets()
        ],
        "roofline": roofline.summary(
            result.overlap, [(r.numel, r.copy_samples) for r in result.rows if r.op == OPS[0]]
        ),
    }
