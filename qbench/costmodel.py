"""Calibrated cost model: fit alpha-beta, codec and compute parameters, predict iteration times.

Pure numpy / pandas over the files qbench writes (``qbench bench comm --json``, ``qbench bench
kernels --json``, sweep results directories); never torch, a launcher or a process.

**Collectives** (per rank, K ranks, a buffer of S bytes, alpha = seconds per message step,
beta = seconds per byte on one rank's link; byte counts as in ``qbench.comm.base``):

* ring allreduce:            t = 2 (K-1) alpha + 2 (K-1) / K * S * beta
* alltoallv (direct):        t =   (K-1) alpha +   (K-1) / K * S * beta
* allgatherv of S per rank:  t =   (K-1) alpha +   (K-1)     * S * beta
* ``exchange`` = alltoallv + allgatherv of 1/K each (reduce-broadcast's comm phase):
                             t = 2 (K-1) alpha + 2 (K-1) / K * P * beta   (P: full payload)

Each measured comm phase gives one point (msgs, wire bytes per call, seconds) and alpha,
beta >= 0 come from a least-squares fit of ``t = msgs * alpha + wire * beta`` per (backend,
network, collective); at K = 2 that is ``t = 2 alpha + wire * beta``. Residuals are weighted by
1 / sqrt(t) (``WEIGHT_POWER``: noise variance taken proportional to the time, between relative
errors, which let the latency-bound smallest sizes decide, and absolute ones, which let the
largest decide); R^2 is reported on the unweighted times.

**Emulated links** (``network: {bandwidth: ...}``, tc tbf): the token bucket holds 2 ms of
traffic (``qbench.launch.netns.tbf_for``), so a call that starts on a full bucket gets up to
that much transfer time free. On shaped links each collective call is therefore charged
``max(0, wire_call * beta - credit)``, the credit (0 <= credit <= the burst time) being fitted
with alpha and beta; unshaped links have none. Predictions for real links drop it
(``Config.tbf_burst = False``).

Fitted collective keys: ``allreduce`` (fp32 allreduce, simulated-lowprec), ``allreduce-fp16`` /
``allreduce-bf16``, ``allreduce-int`` (integer-allreduce's comm phase: the MAX allreduce of the
bucket scales plus the integer allreduce, 2 x 2 (K-1) messages, two calls), ``exchange``
(reduce-broadcast: two calls), ``allgather``; pipelined schemes (``overlap: C``) fit
``exchange+overlap`` / ``allreduce-int+overlap`` with C times the messages, as one continuous
call, from rows where comm bounds the pipeline (see Iteration). A key without a fit falls back
to a related one (``FALLBACK``), with a note in the prediction.

**Other links:** beta scales with the inverse of the link rate, ``beta' = beta * bw_fit /
bw_new``, alpha is kept; the fit on the nearest rate (in log scale) is used. Unshaped (loopback)
fits have no rate and predict unshaped links only.

**Codec:** each op is linear in the elements it touches, ``t = c0 + c1 * units``. Fitted per
(backend, scheme, compressor, op) from the encode / decode phases of ``bench comm`` rows (and of
sweep runs), with ``units`` from ``codec_units`` so that they scale with K (reduce-broadcast
encodes n (1 + 1/K) values and decodes 2 n; allgather decodes K n). Without such a fit the phase
is composed from ``bench kernels`` fits per compressor (seconds vs elements; ``copy`` for the
elementwise divide / zeroing passes).

**Compute:** median ``t_compute`` and ``t_step`` per (workload, batch size, device) from sweep
runs; the step is elementwise (SGD with momentum), so it scales with the gradient size while
compute stays fixed: a model "grown" to more parameters at the same FLOPs, like seed 002's
AlexNet with larger fully connected layers. Ranks on one host slow each other down (memory
bandwidth, the comm library's threads) even with a core each, so a world size the runs had
(on a host with the same core count) takes that world size's medians; others the per-rank
medians of all runs.

**Bench comm for fitting:** ``qbench bench comm --sync stream --gap-ms G`` (calls back to back,
each after G ms of busy CPU, like training steps with G ms of compute) reproduces what ranks
sharing cores see: waits for ranks the scheduler paused. With a core per rank the default
barrier benches predicted held-out runs better (README, "Cost model against held-out runs"):
back to back, Open MPI's 2-rank TCP allreduce flips at random between the link rate and half of
it, and after a barrier it stays at the link rate.

**Imbalance:** the iteration time is the slowest rank's, the phases are means over ranks; their
ratio ``t_iteration / (compute + encode + comm + decode + step)`` is fitted per (backend,
scheme, K) from runs (median, at least 1) and multiplies the sum as ``wait``; a K without runs
takes the nearest fitted K's ratio.

**Iteration:** ``total = (compute + encode + comm + decode + step) * imbalance``. Pipelined schemes
(``overlap: C``): ``total = compute + max(encode + decode, comm) + (encode + decode) / C +
step``, the last term being the pipeline's fill and drain (first chunk's encode, last chunk's
decode) and comm paying C times the messages. ``lowprec-allreduce`` is the *projected* NCCL with
native low-precision reduction: one allreduce of the compressed bytes (bits / 32 of fp32) on
the fp32 allreduce's alpha and beta, one encode and one decode of n values, no decode /
re-encode in the middle.

Fits assume at most one rank per core (true of the bench runs they come from); with
``host_cores`` (K ranks emulated on one host) compute and codec times are multiplied by
max(1, K / host_cores).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qbench import network as network_mod
from qbench.errors import UserError

SCHEMA = "qbench.costmodel/1"
COMM_SCHEMA = "qbench.bench.comm/1"
KERNELS_SCHEMA = "qbench.bench.kernels/1"
PROJECTED = "lowprec-allreduce"
"""NCCL with native low-precision reduction: not measurable yet, so predictions are projected."""
SCHEMES = (
    "allreduce",
    "reduce-broadcast",
    "allgather",
    "integer-allreduce",
    "simulated-lowprec",
    PROJECTED,
)
PIPELINED = ("reduce-broadcast", "integer-allreduce")
FALLBACK = {
    "allreduce-fp16": "allreduce",
    "allreduce-bf16": "allreduce",
    "allreduce-int": "allreduce",
    "allgather": "exchange",
    "exchange+overlap": "exchange",
    "allreduce-int+overlap": "allreduce-int",
}
"""Collective key -> the key whose parameters stand in when it has no fit."""
FP32 = "fp32"
SUMMABLE_INT_BYTES = {"mpi": (1, 2, 4), "gloo": (1, 4), "nccl": (1, 4)}
"""Integer widths each backend sums (qbench.aggregate.integer_allreduce._SUMMABLE)."""
TARGET_ERROR = 0.15
_RELATIVE_FLOOR_S = 1e-6
WEIGHT_POWER = 0.5
"""Least-squares rows are weighted by 1 / t ** WEIGHT_POWER (1: relative errors, 0: absolute)."""
_QSGD = re.compile(r"^qsgd-(\d+)b-b(\d+)")


# -- collectives ---------------------------------------------------------------------------------
def allreduce_wire(nbytes: float, k: int) -> float:
    """Per-rank bytes of a ring allreduce of ``nbytes`` (qbench.comm.base.allreduce_bus_bytes)."""
    return 2 * (k - 1) * nbytes / k


def collective_msgs(kind: str, k: int) -> int:
    """Message steps per rank (each pays alpha) of one collective over K ranks."""
    steps = {"allreduce": 2 * (k - 1), "alltoallv": k - 1, "allgatherv": k - 1}
    steps["exchange"] = steps["alltoallv"] + steps["allgatherv"]
    return steps[kind]


def collective_wire(kind: str, k: int, nbytes: float) -> float:
    """Per-rank wire bytes: ``nbytes`` is the allreduced buffer, the alltoallv send buffer or
    exchange payload (all ranges), or the allgatherv contribution of one rank."""
    factor = {
        "allreduce": 2 * (k - 1) / k,
        "alltoallv": (k - 1) / k,
        "exchange": 2 * (k - 1) / k,
        "allgatherv": float(k - 1),
    }
    return factor[kind] * nbytes


def collective_time(alpha: float, beta: float, kind: str, k: int, nbytes: float) -> float:
    """alpha-beta time of one collective (formulas in the module docstring)."""
    return collective_msgs(kind, k) * alpha + collective_wire(kind, k, nbytes) * beta


def scale_beta(beta: float, bw_fit_bps: float, bw_new_bps: float) -> float:
    """beta on a link of another rate: seconds per byte scale with 1 / bandwidth."""
    return beta * bw_fit_bps / bw_new_bps


def bandwidth_bps(network: str) -> float | None:
    """Link rate of a network label (``1gbit`` -> 1e9); None for ``unshaped``."""
    if network == "unshaped":
        return None
    return network_mod.bits_per_s(network)


def burst_s(network: str) -> float:
    """Seconds of traffic in the tbf bucket of an emulated link (``tbf_for``: 2 ms from 65.5
    Mbit/s up); 0 unshaped."""
    from qbench.launch.netns import tbf_for

    bps = bandwidth_bps(network)
    return 0.0 if bps is None else tbf_for(bps).burst_bytes * 8 / bps


def comm_time(
    alpha: float, beta: float, credit: float, msgs: float, calls: Sequence[float]
) -> float:
    """msgs * alpha + sum over calls of max(0, wire * beta - credit)."""
    return msgs * alpha + sum(max(0.0, w * beta - credit) for w in calls)


# -- schemes and compressors ---------------------------------------------------------------------
@dataclass(frozen=True)
class Scheme:
    name: str
    overlap: int = 1

    @classmethod
    def parse(cls, text: str) -> Scheme:
        """``reduce-broadcast``, ``reduce-broadcast+overlap16``, ``reduce-broadcast:overlap=16``."""
        raw = str(text).strip()
        name, _, rest = raw.partition(":")
        params: dict[str, str] = {}
        if "+" in name:
            name, *extra = name.split("+")
            for e in extra:
                m = re.fullmatch(r"([a-z_]+?)(\d+)", e)
                if not m:
                    raise UserError(f"scheme {raw!r}: cannot read {e!r}; e.g. `+overlap16`")
                params[m.group(1)] = m.group(2)
        for item in filter(None, (s.strip() for s in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise UserError(f"scheme {raw!r}: {item!r} is not KEY=VALUE; e.g. `:overlap=16`")
            params[key.strip()] = value.strip()
        if name not in SCHEMES:
            raise UserError(f"the cost model has no scheme {name!r}; valid: {', '.join(SCHEMES)}")
        if set(params) - {"overlap"}:
            raise UserError(f"scheme {raw!r}: unknown parameter {sorted(params)[0]!r}")
        try:
            overlap = int(params.get("overlap", "1"))
        except ValueError:
            raise UserError(f"scheme {raw!r}: overlap must be a whole number") from None
        if overlap < 1 or (overlap > 1 and name not in PIPELINED):
            raise UserError(
                f"scheme {raw!r}: overlap must be >= 1 and needs one of {', '.join(PIPELINED)}"
            )
        return cls(name, overlap)

    @property
    def label(self) -> str:
        return self.name + (f"+overlap{self.overlap}" if self.overlap > 1 else "")

    @property
    def mode(self) -> str:
        if self.name == PROJECTED:
            return "projected"
        if self.name == "simulated-lowprec":
            return "simulated"
        return "overlap" if self.overlap > 1 else "breakdown"


def qsgd_params(compressor: str) -> tuple[int, int] | None:
    """(bits, bucket_size) of a qsgd label like ``qsgd-4b-b512``."""
    m = _QSGD.match(compressor)
    return (int(m.group(1)), int(m.group(2))) if m else None


def nominal_bits_per_value(compressor: str) -> float | None:
    """Wire bits per value known from the label alone (fp32, fp16, bf16, qsgd)."""
    if compressor == FP32:
        return 32.0
    if compressor in ("fp16", "bf16"):
        return 16.0
    q = qsgd_params(compressor)
    return q[0] + 32 / q[1] if q else None


def incompatibility(scheme: Scheme, compressor: str) -> str | None:
    """Why the scheme cannot carry this compressor (None when it can)."""
    if scheme.name == "allreduce" and compressor not in (FP32, "fp16", "bf16"):
        return (
            f"allreduce sums raw buffers and cannot carry {compressor}; "
            f"`{PROJECTED}` projects a native low-precision allreduce"
        )
    if scheme.name == "integer-allreduce" and compressor != FP32:
        q = qsgd_params(compressor)
        if q is None or q[0] < 2 or "-l2" in compressor:
            return f"integer-allreduce needs qsgd with bits >= 2 and norm max, got {compressor}"
    return None


def int_sum_bytes(backend: str, k: int, bits: int) -> int:
    """Width of integer-allreduce's integers: the narrowest the backend sums without overflow
    for K ranks at level 2^(bits-1) - 1 (qbench.aggregate.integer_allreduce.sum_dtype)."""
    bound = k * ((1 << (bits - 1)) - 1)
    for width in SUMMABLE_INT_BYTES.get(backend, SUMMABLE_INT_BYTES["gloo"]):
        if bound <= 2 ** (8 * width - 1) - 1:
            return width
    raise UserError(f"integer-allreduce: {k} ranks x {bits}-bit levels overflow int32")


def codec_units(scheme: str, k: int, n: float, op: str) -> float:
    """Elements one rank encodes / decodes in one aggregation of n values (the x of the codec
    fits, so that they scale with K)."""
    if scheme == "reduce-broadcast":  # K ranges + the owner's re-encode; owner mean + gather
        return n * (1 + 1 / k) if op == "encode" else 2 * n
    if scheme == "allgather":
        return n if op == "encode" else k * n
    return n


@dataclass(frozen=True)
class CommItem:
    """One comm phase: the collective key, message steps per rank, and the wire bytes per rank of
    each collective call in it (each call may start on a full tbf bucket)."""

    collective: str
    msgs: float
    calls: tuple[float, ...]

    @property
    def wire(self) -> float:
        return float(sum(self.calls))


def comm_plan(
    scheme: Scheme, compressor: str, k: int, n: float, bits_per_value: float, backend: str
) -> CommItem:
    """The comm phase of aggregating n values (payload = n * bits_per_value / 8 bytes).

    Pipelined schemes keep C chunks in flight, one continuous stream: one call for the credit.
    """
    payload = n * bits_per_value / 8
    c = scheme.overlap
    ring = collective_msgs("allreduce", k)
    if scheme.name == "allreduce":
        key = "allreduce" if compressor == FP32 else f"allreduce-{compressor}"
        return CommItem(key, ring, (allreduce_wire(payload, k),))
    if scheme.name in ("simulated-lowprec", PROJECTED):
        nbytes = 4 * math.ceil(payload / 4) if scheme.name == "simulated-lowprec" else payload
        return CommItem("allreduce", ring, (allreduce_wire(nbytes, k),))
    if scheme.name == "reduce-broadcast":
        half = collective_wire("alltoallv", k, payload)  # = the allgatherv's (K-1) P / K
        if c > 1:
            return CommItem("exchange+overlap", c * collective_msgs("exchange", k), (2 * half,))
        return CommItem("exchange", collective_msgs("exchange", k), (half, half))
    if scheme.name == "allgather":
        wire = collective_wire("allgatherv", k, payload)
        return CommItem("allgather", collective_msgs("allgatherv", k), (wire,))
    if scheme.name == "integer-allreduce":
        if compressor == FP32:  # full-precision groups take a plain allreduce
            return CommItem("allreduce", ring, (allreduce_wire(4 * n, k),))
        q = qsgd_params(compressor)
        if q is None:
            raise UserError(f"integer-allreduce needs a qsgd compressor, got {compressor}")
        bits, bucket = q
        ints = allreduce_wire(n * int_sum_bytes(backend, k, bits), k)
        scales = allreduce_wire(4 * math.ceil(n / bucket), k)
        if c > 1:
            return CommItem("allreduce-int+overlap", (1 + c) * ring, (scales, ints))
        return CommItem("allreduce-int", 2 * ring, (scales, ints))
    raise UserError(f"the cost model has no scheme {scheme.name!r}; valid: {', '.join(SCHEMES)}")


def payload_bits(
    scheme: Scheme, compressor: str, bits_per_value: float, backend: str, k: int
) -> float:
    """Bits per value of a rank's own payload (``payload_bytes`` in records)."""
    if scheme.name == "integer-allreduce" and compressor != FP32:
        q = qsgd_params(compressor)
        if q is not None:
            return 8 * int_sum_bytes(backend, k, q[0]) + 32 / q[1]
    return bits_per_value


# -- least squares -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Quality:
    r2: float
    points: int
    rel_err_median: float
    rel_err_max: float


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best feasible solution over every
    subset of active columns (exact for NNLS; fine for 2 columns)."""
    p = x.shape[1]
    best, best_res = np.zeros(p), float(np.sum(y**2))
    for mask in itertools.product((False, True), repeat=p):
        cols = [i for i in range(p) if mask[i]]
        if not cols:
            continue
        sol = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
        if np.any(sol < 0):
            continue
        coef = np.zeros(p)
        coef[cols] = sol
        res = float(np.sum((x @ coef - y) ** 2))
        if res < best_res - 1e-30:
            best, best_res = coef, res
    return best


def fit_linear(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, Quality]:
    """Coefficients >= 0 of ``t = x @ coef`` by least squares with rows weighted by
    1 / t ** WEIGHT_POWER; R^2 on the unweighted times and the relative errors of the points."""
    x = np.asarray(x, dtype=float)
    t = np.asarray(t, dtype=float)
    w = 1 / np.maximum(t, _RELATIVE_FLOOR_S) ** WEIGHT_POWER
    coef = nnls(x * w[:, None], t * w)
    pred = x @ coef
    ss_res = float(np.sum((pred - t) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-30 else 0.0)
    pos = t > 0
    rel = np.abs(pred[pos] / t[pos] - 1) if pos.any() else np.zeros(1)
    return coef, Quality(r2, len(t), float(np.median(rel)), float(np.max(rel)))


# -- fitted parameters ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class CollectiveFit:
    backend: str
    network: str
    collective: str
    alpha_s: float
    """Seconds per message step."""
    beta_s_per_byte: float
    credit_s: float = 0.0
    """Seconds of transfer each call gets free from the tbf bucket (0 unshaped)."""
    r2: float
    points: int
    rel_err_median: float
    rel_err_max: float
    data: list[dict[str, Any]] = field(default_factory=list)
    """The points: world_size, msgs, calls (wire bytes per call), seconds, source, ..."""

    @property
    def bandwidth_bps(self) -> float | None:
        return bandwidth_bps(self.network)

    def time(
        self, msgs: float, calls: Sequence[float], network: str | None = None, tbf: bool = True
    ) -> float:
        """Seconds on ``network`` (default: the fitted link): beta scaled by the rate, the
        credit capped by that link's burst (0 with ``tbf=False``: a real link, no shaper)."""
        network = network or self.network
        beta = self.beta_s_per_byte
        if network != self.network:
            old, new = self.bandwidth_bps, bandwidth_bps(network)
            if old is None or new is None:
                raise UserError(f"cannot scale a {self.network} fit to a {network} link")
            beta = scale_beta(beta, old, new)
        credit = min(self.credit_s, burst_s(network)) if tbf else 0.0
        return comm_time(self.alpha_s, beta, credit, msgs, calls)


@dataclass(frozen=True, kw_only=True)
class CodecFit:
    """t = c0 + c1 * units. Phase fits: per (backend, scheme, compressor, op) in
    ``codec_units``; kernel fits (backend and scheme empty): per element of one call, op encode,
    decode or copy."""

    backend: str
    scheme: str
    compressor: str
    op: str
    device: str
    c0_s: float
    c1_s: float
    r2: float
    points: int
    rel_err_median: float
    rel_err_max: float
    data: list[dict[str, Any]] = field(default_factory=list)

    def time(self, units: float, calls: float = 1.0) -> float:
        return calls * self.c0_s + self.c1_s * units


@dataclass(frozen=True, kw_only=True)
class ComputeFit:
    workload: str
    batch_size: int
    device: str
    compute_s: float
    """Median over runs of the median forward + backward time."""
    step_s: float
    numel: int
    runs: int
    world_sizes: list[int] = field(default_factory=list)
    per_world_size: dict[str, list[float]] = field(default_factory=dict)
    """K -> [compute_s, step_s]: medians over the runs at K ranks as measured, CPU sharing and
    memory-bandwidth contention included (``compute_s``/``step_s`` are per rank on a core of
    its own: K / host_cores divided out)."""
    host_cores: int | None = None
    """Cores of the host the runs shared (None: GPU or unknown)."""

    @property
    def step_s_per_element(self) -> float:
        return self.step_s / max(self.numel, 1)

    def at(self, k: int, host_cores: int | None) -> tuple[float, float] | None:
        """(compute, step) measured at K ranks on a host like this one, else None."""
        got = self.per_world_size.get(str(k))
        if got is None or host_cores != self.host_cores:
            return None
        return got[0], got[1]


@dataclass
class CostModel:
    collectives: list[CollectiveFit] = field(default_factory=list)
    phases: list[CodecFit] = field(default_factory=list)
    kernels: list[CodecFit] = field(default_factory=list)
    compute: list[ComputeFit] = field(default_factory=list)
    compressors: dict[str, float] = field(default_factory=dict)
    """Compressor label -> wire bits per value seen in the inputs."""
    sources: list[dict[str, Any]] = field(default_factory=list)
    used: list[str] = field(default_factory=list)
    """Keys of every measurement the fit used (see ``bench_key`` / ``run_key``)."""
    notes: list[str] = field(default_factory=list)
    imbalance: dict[str, float] = field(default_factory=dict)
    """``backend/scheme/K`` -> median over runs of t_iteration / (sum of the mean phases): the
    slowest rank's lag (``imbalance_key``)."""
    solo_comm: dict[str, float] = field(default_factory=dict)
    """``backend/scheme/workload`` -> median t_comm of its 1-rank runs: a collective on one
    rank sends nothing but still costs (Gloo: about 0.5 ms for reduce-broadcast)."""

    def to_dict(self) -> dict[str, Any]:
        return _no_nan({"schema": SCHEMA, **asdict(self)})

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "model") -> CostModel:
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise UserError(
                f"{source}: not a fitted cost model (schema {got!r}, expected {SCHEMA!r}); "
                "write one with `qbench model fit`"
            )
        try:
            return cls(
                collectives=[CollectiveFit(**c) for c in d.get("collectives", [])],
                phases=[CodecFit(**c) for c in d.get("phases", [])],
                kernels=[CodecFit(**c) for c in d.get("kernels", [])],
                compute=[ComputeFit(**c) for c in d.get("compute", [])],
                compressors={str(k): float(v) for k, v in d.get("compressors", {}).items()},
                sources=list(d.get("sources", [])),
                used=list(d.get("used", [])),
                notes=list(d.get("notes", [])),
                imbalance={str(k): float(v) for k, v in d.get("imbalance", {}).items()},
                solo_comm={str(k): float(v) for k, v in d.get("solo_comm", {}).items()},
            )
        except (TypeError, ValueError) as e:
            raise UserError(f"{source}: malformed cost model ({e}); fit it again") from None

    def save(self, path: Path | str) -> None:
        from qbench.store import atomic_write_json

        atomic_write_json(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: Path | str) -> CostModel:
        return cls.from_dict(_read_json(Path(path)), str(path))

    @property
    def backends(self) -> list[str]:
        return sorted({c.backend for c in self.collectives})

    @property
    def networks(self) -> list[str]:
        return sorted({c.network for c in self.collectives})


def _no_nan(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _no_nan(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_no_nan(v) for v in obj]
    if isinstance(obj, np.generic):
        return _no_nan(obj.item())
    return obj


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise UserError(f"{path}: file not found; check the path")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None


# -- inputs --------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class CommPoint:
    backend: str
    network: str
    collective: str
    world_size: int
    msgs: float
    calls: tuple[float, ...]
    """Wire bytes per rank of each collective call in the phase."""
    seconds: float
    source: str
    scheme: str
    compressor: str
    bytes: int

    @property
    def wire_bytes(self) -> float:
        return float(sum(self.calls))


@dataclass(frozen=True, kw_only=True)
class PhasePoint:
    backend: str
    scheme: str
    compressor: str
    op: str
    world_size: int
    units: float
    seconds: float
    source: str
    bytes: int


def bench_key(row: dict[str, Any]) -> str:
    """Identity of a bench comm row (to tell fitted rows from held-out ones): its configuration
    and measured time, so the same measurement matches whatever path its file is read from."""
    return (
        f"bench:{row['backend']}/{row['network']}/w{row['world_size']}/{row['scheme']}/"
        f"{row['compressor']}/{row['bytes']}/{float(row['time_s']):.9g}"
    )


def run_key(run_id: str) -> str:
    return f"run:{run_id}"


def comm_rows(doc: Any, source: str) -> list[dict[str, Any]]:
    """The rows of a ``qbench bench comm --json`` document (UserError if it is not one)."""
    if not isinstance(doc, dict) or doc.get("schema") != COMM_SCHEMA:
        raise UserError(f"{source}: not a `qbench bench comm --json` file (schema {COMM_SCHEMA!r})")
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise UserError(f"{source}: has no rows list")
    need = ("backend", "world_size", "network", "scheme", "compressor", "bytes", "time_s")
    for r in rows:
        missing = [k for k in need if not isinstance(r, dict) or k not in r]
        if missing:
            raise UserError(f"{source}: a row lacks {', '.join(missing)}")
    return rows


def _nan(v: Any) -> float:
    return math.nan if v is None else float(v)


def _row_bits(row: dict[str, Any]) -> float:
    """Wire bits per value of the row's compressor. integer-allreduce rows report their integer
    payload (8 bits and more), not the compressor's: their label says it."""
    nominal = nominal_bits_per_value(row["compressor"])
    bpv = row.get("bits_per_value")
    if bpv is None or (nominal is not None and str(row["scheme"]).startswith("integer-")):
        return nominal or 32.0
    return float(bpv)


def _bench_points(
    rows: Sequence[dict[str, Any]], source: str
) -> tuple[list[CommPoint], list[PhasePoint], list[dict[str, Any]], list[str]]:
    """Synchronised rows -> comm and phase points; overlapped rows are returned for later."""
    comm: list[CommPoint] = []
    phases: list[PhasePoint] = []
    overlapped: list[dict[str, Any]] = []
    notes: list[str] = []
    for r in rows:
        try:
            scheme = Scheme.parse(r["scheme"])
        except UserError:
            notes.append(f"{source}: no model for scheme {r['scheme']}; its rows are not used")
            continue
        k, s = int(r["world_size"]), int(r["bytes"])
        n = s / 4
        if scheme.overlap > 1 or r.get("t_comm_s") is None:
            overlapped.append(r)
            continue
        item = comm_plan(scheme, r["compressor"], k, n, _row_bits(r), r["backend"])
        comm.append(CommPoint(
            backend=r["backend"], network=r["network"], collective=item.collective, world_size=k,
            msgs=item.msgs, calls=_measured_calls(item, r.get("wire_bytes")),
            seconds=float(r["t_comm_s"]), scheme=scheme.label,
            compressor=r["compressor"], source=source, bytes=s,
        ))  # fmt: skip
        for op in ("encode", "decode"):
            t = _nan(r.get(f"t_{op}_s"))
            if math.isfinite(t):
                phases.append(PhasePoint(
                    backend=r["backend"], scheme=scheme.name, compressor=r["compressor"], op=op,
                    world_size=k, units=codec_units(scheme.name, k, n, op), seconds=t,
                    source=source, bytes=s,
                ))  # fmt: skip
    return comm, phases, overlapped, notes


def _measured_calls(item: CommItem, wire: Any) -> tuple[float, ...]:
    """The plan's per-call bytes, rescaled to the measured total when there is one."""
    if wire is None or not item.wire or not math.isfinite(float(wire)):
        return item.calls
    return tuple(c * float(wire) / item.wire for c in item.calls)


def kernel_rows(doc: Any, source: str) -> list[dict[str, Any]]:
    if not isinstance(doc, dict) or doc.get("schema") != KERNELS_SCHEMA:
        raise UserError(
            f"{source}: not a `qbench bench kernels --json` file (schema {KERNELS_SCHEMA!r})"
        )
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise UserError(f"{source}: has no rows list")
    need = ("compressor", "op", "numel", "seconds", "copy_seconds")
    for r in rows:
        if not isinstance(r, dict) or any(k not in r for k in need):
            raise UserError(f"{source}: a row lacks one of {', '.join(need)}")
    return rows


def _fit_kernels(rows: Sequence[tuple[dict[str, Any], str]]) -> list[CodecFit]:
    groups: dict[tuple[str, str, str], list[tuple[float, float, str]]] = {}
    copies: dict[tuple[str, int], list[float]] = {}
    for r, source in rows:
        device = str(r.get("device", "cpu")).split(":")[0]
        groups.setdefault((r["compressor"], r["op"], device), []).append(
            (float(r["numel"]), float(r["seconds"]), source)
        )
        copies.setdefault((device, int(r["numel"])), []).append(float(r["copy_seconds"]))
    for (device, numel), ts in copies.items():
        groups.setdefault(("", "copy", device), []).append(
            (float(numel), float(np.median(ts)), "copy_seconds")
        )
    fits = []
    for (comp, op, device), pts in sorted(groups.items()):
        x = np.array([[1.0, p[0]] for p in pts])
        coef, q = fit_linear(x, np.array([p[1] for p in pts]))
        fits.append(CodecFit(
            backend="", scheme="", compressor=comp, op=op, device=device, c0_s=float(coef[0]),
            c1_s=float(coef[1]), **asdict(q),
            data=[{"numel": p[0], "seconds": p[1], "source": p[2]} for p in pts],
        ))  # fmt: skip
    return fits


def _fit_phases(points: Sequence[PhasePoint]) -> list[CodecFit]:
    groups: dict[tuple[str, str, str, str], list[PhasePoint]] = {}
    for p in points:
        groups.setdefault((p.backend, p.scheme, p.compressor, p.op), []).append(p)
    fits = []
    for (backend, scheme, comp, op), pts in sorted(groups.items()):
        x = np.array([[1.0, p.units] for p in pts])
        coef, q = fit_linear(x, np.array([p.seconds for p in pts]))
        fits.append(CodecFit(
            backend=backend, scheme=scheme, compressor=comp, op=op, device="cpu",
            c0_s=float(coef[0]), c1_s=float(coef[1]), **asdict(q),
            data=[{"world_size": p.world_size, "units": p.units, "seconds": p.seconds,
                   "bytes": p.bytes, "source": p.source} for p in pts],
        ))  # fmt: skip
    return fits


def fit_collective(
    msgs: np.ndarray, calls: Sequence[Sequence[float]], t: np.ndarray, credit_max: float
) -> tuple[float, float, float, Quality]:
    """(alpha, beta, credit) of ``t = msgs alpha + sum_calls max(0, wire beta - credit)``,
    alpha, beta >= 0, 0 <= credit <= credit_max, by weighted least squares (``fit_linear``).

    For a fixed credit the calls that outlast it are linear in alpha and beta: iterate NNLS on
    that active set until it settles; the credit comes from a grid refined around its best."""
    msgs = np.asarray(msgs, dtype=float)
    t = np.asarray(t, dtype=float)
    w = 1 / np.maximum(t, _RELATIVE_FLOOR_S) ** WEIGHT_POWER

    def pred(alpha: float, beta: float, credit: float) -> np.ndarray:
        return np.array(
            [comm_time(alpha, beta, credit, m, c) for m, c in zip(msgs, calls, strict=True)]
        )

    def solve(credit: float) -> tuple[float, float, float, float]:
        beta = math.inf  # every call active first
        best = (math.inf, 0.0, 0.0)
        for _ in range(25):
            active = [[x for x in c if x * beta > credit] for c in calls]
            x = np.array([[m, sum(a)] for m, a in zip(msgs, active, strict=True)])
            y = t + credit * np.array([len(a) for a in active])
            alpha, new_beta = nnls(x * w[:, None], y * w)
            err = float(np.sum(((pred(alpha, new_beta, credit) - t) * w) ** 2))
            if err < best[0]:
                best = (err, float(alpha), float(new_beta))
            if new_beta == beta:
                break
            beta = new_beta
        return best[0], best[1], best[2], credit

    def best(tried: list[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
        # Where every call outlasts the credit, credit and alpha trade off exactly (at one K):
        # among equally good fits the smallest credit wins.
        low = min(f[0] for f in tried)
        return min((f for f in tried if f[0] <= low * (1 + 1e-9) + 1e-24), key=lambda f: f[3])

    if credit_max <= 0:
        found = solve(0.0)
    else:
        found = best([solve(float(c)) for c in np.linspace(0.0, credit_max, 21)])
        step = credit_max / 20
        lo, hi = max(0.0, found[3] - step), min(credit_max, found[3] + step)
        found = best([found, *(solve(float(c)) for c in np.linspace(lo, hi, 21))])
    _, alpha, beta, credit = found
    p = pred(alpha, beta, credit)
    ss_res = float(np.sum((p - t) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-30 else 0.0)
    pos = t > 0
    rel = np.abs(p[pos] / t[pos] - 1) if pos.any() else np.zeros(1)
    return alpha, beta, credit, Quality(r2, len(t), float(np.median(rel)), float(np.max(rel)))


def fit_collectives(points: Sequence[CommPoint]) -> list[CollectiveFit]:
    """alpha, beta (and on emulated links the burst credit) per (backend, network,
    collective)."""
    groups: dict[tuple[str, str, str], list[CommPoint]] = {}
    for p in points:
        groups.setdefault((p.backend, p.network, p.collective), []).append(p)
    fits = []
    for (backend, net, coll), pts in sorted(groups.items()):
        alpha, beta, credit, q = fit_collective(
            np.array([p.msgs for p in pts]), [p.calls for p in pts],
            np.array([p.seconds for p in pts]), burst_s(net),
        )  # fmt: skip
        fits.append(CollectiveFit(
            backend=backend, network=net, collective=coll, alpha_s=alpha, beta_s_per_byte=beta,
            credit_s=credit, **asdict(q),
            data=[{k: v for k, v in asdict(p).items()
                   if k not in ("backend", "network", "collective")} for p in pts],
        ))  # fmt: skip
    return fits


# -- runs ----------------------------------------------------------------------------------------
RUN_PARTS = ("t_compute", "t_encode", "t_comm", "t_decode", "t_step")


def run_table(root: Path | str) -> pd.DataFrame:
    """One row per ok run of a results directory: labels and medians over measured iterations
    (``qbench.stats`` conventions: iteration = max over ranks, parts = means over ranks)."""
    from qbench import stats

    results = stats.load(root)
    runs = results.runs[results.runs["status"] == "ok"]
    if runs.empty or results.iterations.empty:
        return pd.DataFrame()
    per_it = stats.per_iteration(results.iterations)
    cols = ["t_iteration", *RUN_PARTS, "bytes_sent", "payload_bytes", "grad_bytes"]
    med = per_it.groupby("run_id")[cols].median().reset_index()
    table = runs.merge(med, on="run_id", how="inner")
    if "device" not in table.columns:
        table["device"] = None
    table["device"] = [
        d if isinstance(d, str) and d else ("cuda" if b == "nccl" else "cpu")
        for d, b in zip(table["device"], table["backend"], strict=True)
    ]
    table["workload"] = [_workload(m, p) for m, p in _pairs(table, "model", "model_params")]
    table["source"] = str(root)
    return table.reset_index(drop=True)


def _pairs(table: pd.DataFrame, a: str, b: str) -> Iterable[tuple[Any, Any]]:
    right = table[b] if b in table.columns else pd.Series([None] * len(table), index=table.index)
    return zip(table[a], right, strict=True)


def _workload(model: Any, params: Any) -> str:
    """``resnet20``, or ``synthetic(gflops=0.01,params=4000000)`` with model parameters."""
    given = {k: v for k, v in params.items() if v is not None} if isinstance(params, dict) else {}
    if given:
        return f"{model}(" + ",".join(f"{k}={v}" for k, v in sorted(given.items())) + ")"
    return str(model)


def compute_fits(model: CostModel, workload: str) -> list[ComputeFit]:
    """Fits of a workload: by its full name, else by model name when only one workload has it
    (``synthetic`` for ``synthetic(params=...)``)."""
    exact = [c for c in model.compute if c.workload == workload]
    if exact:
        return exact
    named = [c for c in model.compute if c.workload.split("(")[0] == workload]
    return named if len({c.workload for c in named}) == 1 else []


def _fp32_numel(n: int, payload: float, bits: float) -> int:
    """Values the layer policy kept in fp32, from the payload size: payload = 4 f + (n - f) b/8."""
    if not (math.isfinite(payload) and bits < 32 and n > 0):
        return 0
    f = (payload - n * bits / 8) / (4 - bits / 8)
    return int(min(max(round(f), 0), n))


def _run_config(r: Any, model: CostModel | None = None) -> tuple[Scheme, Config] | None:
    try:
        scheme = Scheme.parse(str(r.scheme))
    except UserError:
        return None
    comp = str(r.compressor)
    k, n = int(r.world_size), _int(r.numel) or 0
    if n <= 0:
        n = int(r.grad_bytes // 4) if pd.notna(r.grad_bytes) else 0
    if n <= 0:
        return None
    bits = nominal_bits_per_value(comp)
    if bits is None and model is not None:
        bits = model.compressors.get(comp)
    if bits is None:
        bits = 8 * float(r.payload_bytes) / n if pd.notna(r.payload_bytes) else 32.0
    pbits = payload_bits(scheme, comp, bits, str(r.backend), k)
    f = _fp32_numel(n, float(r.payload_bytes), pbits) if comp != FP32 else 0
    cfg = Config(
        scheme=scheme.label, compressor=comp, bits_per_value=bits, backend=str(r.backend),
        network=str(r.network), world_size=k, numel=n, fp32_numel=f, workload=str(r.workload),
        batch_size=_int(r.batch_size), device=str(r.device), host_cores=_host_cores(r),
    )  # fmt: skip
    return scheme, cfg


def _host_cores(r: Any) -> int | None:
    """CPU cores the run's ranks shared: the host's cores x nodes (None on GPUs or unknown).
    K CPU ranks on fewer cores compute K / cores times slower (``Config.host_cores``)."""
    cores = _int(getattr(r, "host_cores", None))
    if not cores or str(getattr(r, "device", "cpu")) != "cpu":
        return None
    return cores * (_int(getattr(r, "nodes", None)) or 1)


def _row_share(r: Any) -> float:
    """``_cpu_share`` of a run-table row."""
    cores = _host_cores(r)
    return max(1.0, int(r.world_size) / cores) if cores else 1.0


def _cpu_share(cfg: Config) -> float:
    """How much slower CPU work ran than on a core of its own: max(1, K / host_cores)."""
    return max(1.0, cfg.world_size / cfg.host_cores) if cfg.host_cores else 1.0


def _int(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def imbalance_key(backend: str, scheme: str, k: int) -> str:
    return f"{backend}/{scheme}/{k}"


def solo_key(backend: str, scheme: str, workload: str | None) -> str:
    return f"{backend}/{scheme}/{workload}"


def _phased_runs(table: pd.DataFrame) -> Iterable[tuple[Any, Scheme, float]]:
    """(row, scheme, sum of the phases) of runs whose phases add up to the iteration: a known
    scheme without overlap, every phase measured."""
    for r in table.itertuples(index=False):
        if not all(pd.notna(getattr(r, p)) for p in (*RUN_PARTS, "t_iteration")):
            continue
        try:
            scheme = Scheme.parse(str(r.scheme))
        except UserError:
            continue
        if scheme.overlap == 1:
            yield r, scheme, sum(float(getattr(r, p)) for p in RUN_PARTS)


def _imbalance(table: pd.DataFrame) -> dict[str, float]:
    """Per (backend, scheme, K > 1): the median of the iteration time (max over ranks) over the
    sum of the phases (means over ranks). Ranks finish a step at different times; the slowest
    sets the pace, and no phase is charged for it."""
    ratios: dict[str, list[float]] = {}
    for r, scheme, parts in _phased_runs(table):
        if int(r.world_size) > 1 and parts > 0:
            key = imbalance_key(str(r.backend), scheme.label, int(r.world_size))
            ratios.setdefault(key, []).append(float(r.t_iteration) / parts)
    return {k: max(1.0, float(np.median(v))) for k, v in sorted(ratios.items())}


def _solo_comm(table: pd.DataFrame) -> dict[str, float]:
    """Per (backend, scheme, workload) of 1-rank runs: the median comm phase."""
    times: dict[str, list[float]] = {}
    for r, scheme, _ in _phased_runs(table):
        if int(r.world_size) == 1:
            key = solo_key(str(r.backend), scheme.label, str(r.workload))
            times.setdefault(key, []).append(float(r.t_comm))
    return {k: float(np.median(v)) for k, v in sorted(times.items())}


def _run_points(
    table: pd.DataFrame, with_comm: bool
) -> tuple[list[CommPoint], list[PhasePoint], list[ComputeFit], list[str]]:
    comm: list[CommPoint] = []
    phases: list[PhasePoint] = []
    groups: dict[tuple[str, int, str], list[Any]] = {}
    used: list[str] = []
    for r in table.itertuples(index=False):
        groups.setdefault((str(r.workload), _int(r.batch_size) or 0, str(r.device)), []).append(r)
        used.append(run_key(str(r.run_id)))
        got = _run_config(r)
        if got is None:
            continue
        scheme, cfg = got
        if scheme.overlap > 1 or not all(pd.notna(getattr(r, p)) for p in RUN_PARTS):
            continue
        k, n = cfg.world_size, (cfg.numel or 0) - cfg.fp32_numel
        src, nbytes = str(r.source), 4 * (cfg.numel or 0)
        for op in ("encode", "decode"):
            phases.append(PhasePoint(
                backend=cfg.backend, scheme=scheme.name, compressor=cfg.compressor, op=op,
                world_size=k, units=codec_units(scheme.name, k, n, op),
                seconds=float(getattr(r, f"t_{op}")) / _cpu_share(cfg), source=src, bytes=nbytes,
            ))  # fmt: skip
        if with_comm and k > 1:
            items = _comm_items(scheme, cfg)
            if len({i.collective for i in items}) == 1:  # one key: the phase is one point
                merged = CommItem(
                    items[0].collective, sum(i.msgs for i in items),
                    tuple(c for i in items for c in i.calls),
                )  # fmt: skip
                comm.append(CommPoint(
                    backend=cfg.backend, network=cfg.network, collective=merged.collective,
                    world_size=k, msgs=merged.msgs, calls=_measured_calls(merged, r.bytes_sent),
                    seconds=float(r.t_comm), scheme=scheme.label,
                    compressor=cfg.compressor, source=src, bytes=nbytes,
                ))  # fmt: skip
    compute = []
    for (workload, batch, device), rs in sorted(groups.items()):
        ks = sorted({int(r.world_size) for r in rs})
        cores = {_host_cores(r) for r in rs}
        per_k = {
            str(k): [float(np.median([getattr(r, p) for r in rs if int(r.world_size) == k]))
                     for p in ("t_compute", "t_step")]
            for k in ks
        } if len(cores) == 1 else {}  # fmt: skip
        compute.append(ComputeFit(
            workload=workload, batch_size=batch, device=device,
            compute_s=float(np.median([r.t_compute / _row_share(r) for r in rs])),
            step_s=float(np.median([r.t_step / _row_share(r) for r in rs])),
            numel=int(np.median([r.grad_bytes // 4 for r in rs])), runs=len(rs),
            world_sizes=ks, per_world_size=per_k,
            host_cores=next(iter(cores)) if len(cores) == 1 else None,
        ))  # fmt: skip
    return comm, phases, compute, used


# -- fit -----------------------------------------------------------------------------------------
def fit(
    *,
    comm_docs: Sequence[tuple[Any, str]] = (),
    kernel_docs: Sequence[tuple[Any, str]] = (),
    run_dirs: Sequence[Path | str] = (),
    comm_from_runs: bool = False,
    hold_out: Sequence[tuple[str, str]] = (),
) -> CostModel:
    """Fit every parameter the inputs allow. comm_docs / kernel_docs: (parsed JSON, name).
    hold_out: (label, value) pairs; runs with any such label value (compared as text, e.g.
    ``("world_size", "4")``, ``("network", "300mbit")``) are left out of the fit, so that
    ``validate`` scores them as held-out."""
    model = CostModel()
    comm: list[CommPoint] = []
    phases: list[PhasePoint] = []
    overlapped: list[tuple[dict[str, Any], str]] = []
    for doc, source in comm_docs:
        rows = comm_rows(doc, source)
        c, p, o, notes = _bench_points(rows, source)
        comm += c
        phases += p
        overlapped += [(r, source) for r in o]
        model.notes += notes
        model.used += [bench_key(r) for r in rows]
        model.compressors.update(
            {r["compressor"]: _row_bits(r) for r in rows if not r["scheme"].startswith("integer-")}
        )
        model.sources.append(_source(doc, source, "comm", len(rows)))
    krows: list[tuple[dict[str, Any], str]] = []
    tables: list[pd.DataFrame] = []
    for doc, source in kernel_docs:
        rows = kernel_rows(doc, source)
        krows += [(r, source) for r in rows]
        for r in rows:
            if r.get("bits_per_value") is not None:
                model.compressors.setdefault(r["compressor"], float(r["bits_per_value"]))
        model.sources.append(_source(doc, source, "kernels", len(rows)))
    for d in run_dirs:
        table = held_out(run_table(d), hold_out)
        if table.empty:
            raise UserError(
                f"{d}: no completed runs (run.json with status ok) to fit from"
                + (" after --hold-out" if hold_out else "")
            )
        c, p, compute, used = _run_points(table, comm_from_runs)
        tables.append(table)
        comm += c
        phases += p
        model.compute += compute
        model.used += used
        model.sources.append({"path": str(d), "kind": "runs", "rows": len(table)})
    if not (comm or krows or model.compute):
        raise UserError(
            "nothing to fit: give a results DIR, --comm FILE.json or --kernels FILE.json"
        )
    model.kernels = _fit_kernels(krows)
    model.phases = _fit_phases(phases)
    if tables:
        runs = pd.concat(tables, ignore_index=True)
        model.imbalance = _imbalance(runs)
        model.solo_comm = _solo_comm(runs)
    model.collectives = fit_collectives(comm)
    extra = _overlap_points(model, overlapped)
    if extra:
        model.collectives = fit_collectives([*comm, *extra])
    return model


def held_out(table: pd.DataFrame, hold_out: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """``table`` without the runs that match any (label, value) of ``hold_out``."""
    if table.empty or not hold_out:
        return table
    keep = pd.Series(True, index=table.index)
    for key, value in hold_out:
        if key not in table.columns:
            raise UserError(
                f"--hold-out {key}={value}: no run label {key!r}; use one of world_size, "
                "network, backend, scheme, compressor, model, batch_size"
            )
        keep &= table[key].astype(str) != value
    return table[keep].reset_index(drop=True)


def _source(doc: dict[str, Any], source: str, kind: str, rows: int) -> dict[str, Any]:
    raw = doc.get("machine")
    machine: dict[str, Any] = raw if isinstance(raw, dict) else {}
    keep = ("cpu", "cores", "hostname", "gpus")
    return {
        "path": source, "kind": kind, "rows": rows, "git_commit": doc.get("git_commit"),
        "machine": {k: machine.get(k) for k in keep if k in machine},
        "settings": doc.get("settings"),
    }  # fmt: skip


def _overlap_points(
    model: CostModel, rows: Sequence[tuple[dict[str, Any], str]]
) -> list[CommPoint]:
    """Pipelined rows give their comm as time - fill, where comm bounds the pipeline
    (comm >= encode + decode of the synchronised scheme); other rows say nothing about it."""
    out = []
    for r, source in rows:
        scheme = Scheme.parse(r["scheme"])
        k, s, comp = int(r["world_size"]), int(r["bytes"]), r["compressor"]
        try:
            enc, _ = _codec(model, r["backend"], Scheme(scheme.name), comp, k, s / 4, "encode")
            dec, _ = _codec(model, r["backend"], Scheme(scheme.name), comp, k, s / 4, "decode")
        except UserError:
            model.notes.append(f"{source}: {r['scheme']} {comp}: no codec fit; row not used")
            continue
        comm_s = float(r["time_s"]) - (enc + dec) / scheme.overlap
        if comm_s < enc + dec:
            continue
        item = comm_plan(scheme, comp, k, s / 4, _row_bits(r), r["backend"])
        out.append(CommPoint(
            backend=r["backend"], network=r["network"], collective=item.collective,
            world_size=k, msgs=item.msgs, calls=_measured_calls(item, r.get("wire_bytes")),
            seconds=comm_s, source=source, scheme=scheme.label, compressor=comp, bytes=s,
        ))  # fmt: skip
    return out


def load_input(path: Path | str) -> tuple[str, Any]:
    """("runs", path) for a results directory, ("comm" | "kernels", parsed JSON) for a file."""
    p = Path(path)
    if p.is_dir():
        return "runs", p
    doc = _read_json(p)
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema == COMM_SCHEMA:
        return "comm", doc
    if schema == KERNELS_SCHEMA:
        return "kernels", doc
    raise UserError(
        f"{p}: neither a results directory nor a `qbench bench comm|kernels --json` file "
        f"(schema {schema!r})"
    )


# -- predict -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Config:
    """One configuration to predict. numel None: the workload's fitted gradient size."""

    scheme: str = "allreduce"
    compressor: str = FP32
    bits_per_value: float | None = None
    """Wire bits per value of the compressor; None: from its label or the model's inputs."""
    backend: str = "gloo"
    network: str = "1gbit"
    world_size: int = 2
    numel: int | None = None
    fp32_numel: int = 0
    """Values the layer policy keeps in full precision (aggregated by the same scheme in fp32)."""
    workload: str | None = None
    batch_size: int | None = None
    device: str = "cpu"
    compute_s: float | None = None
    """Forward + backward seconds; None: the workload's fit, or 0 without one."""
    step_s: float | None = None
    """Optimizer step seconds at this numel; None: the workload's per-element fit, or 0."""
    host_cores: int | None = None
    tbf_burst: bool = True
    """Shaped links are qbench's tbf emulation, whose bucket lets each call start with a burst;
    False for real links (no credit)."""


@dataclass(frozen=True, kw_only=True)
class Prediction:
    config: Config
    mode: str
    compute_s: float
    encode_s: float
    comm_s: float
    decode_s: float
    step_s: float
    total_s: float
    wire_bytes: float
    wait_s: float = 0.0
    """The slowest rank's lag (``CostModel.imbalance``), included in ``total_s``."""
    notes: tuple[str, ...] = ()

    @property
    def aggregate_s(self) -> float:
        return self.total_s - self.compute_s - self.step_s


def _bits(model: CostModel, cfg: Config) -> float:
    if cfg.bits_per_value is not None:
        return cfg.bits_per_value
    bits = nominal_bits_per_value(cfg.compressor) or model.compressors.get(cfg.compressor)
    if bits is None:
        raise UserError(
            f"bits per value of {cfg.compressor} unknown: fit on bench data that includes it "
            "or give them"
        )
    return bits


def _collective(
    model: CostModel, backend: str, network: str, key: str
) -> tuple[CollectiveFit, list[str]]:
    """The fit for a collective on a link: the same key (scaled from the nearest rate if
    needed) first, then its fallbacks."""
    want = bandwidth_bps(network)
    tried, notes = [], []
    k: str | None = key
    while k is not None:
        tried.append(k)
        fits = [c for c in model.collectives if c.backend == backend and c.collective == k]
        exact = [c for c in fits if c.network == network]
        chosen = exact[0] if exact else None
        if chosen is None and want is not None:
            chosen = _nearest([c for c in fits if c.bandwidth_bps is not None], want)
        if chosen is not None:
            if k != key:
                notes.append(f"{key} not fitted: {k} parameters stand in")
            if chosen.network != network:
                notes.append(f"{backend} {k} scaled from {chosen.network} to {network}")
            return chosen, notes
        k = FALLBACK.get(k)
    have = sorted({f"{c.backend}/{c.network}/{c.collective}" for c in model.collectives})
    raise UserError(
        f"no fit for {backend} {'/'.join(tried)} usable on {network} links (fitted: "
        f"{', '.join(have) or 'none'}); fit on `qbench bench comm --backend {backend}` data"
        + (" measured unshaped" if want is None else "")
    )


def _nearest(fits: Sequence[CollectiveFit], bps: float) -> CollectiveFit | None:
    """The fit whose link rate is nearest to ``bps`` in log scale."""
    best, best_d = None, math.inf
    for c in fits:
        d = abs(math.log((c.bandwidth_bps or bps) / bps))
        if d < best_d:
            best, best_d = c, d
    return best


def _kernel(model: CostModel, compressor: str, op: str, device: str) -> CodecFit | None:
    for c in model.kernels:
        if c.compressor == compressor and c.op == op and c.device == device:
            return c
    return None


def _codec(
    model: CostModel, backend: str, scheme: Scheme, compressor: str, k: int, n: float, op: str,
    device: str = "cpu",
) -> tuple[float, list[str]]:  # fmt: skip
    """Seconds of a scheme's encode or decode phase for n values over K ranks."""
    if n <= 0:
        return 0.0, []
    # The projection encodes and decodes n values once, as simulated-lowprec does.
    name = "simulated-lowprec" if scheme.name == PROJECTED else scheme.name
    fits = [p for p in model.phases if (p.scheme, p.compressor, p.op) == (name, compressor, op)]
    same = [p for p in fits if p.backend == backend]
    if same or fits:
        p = (same or fits)[0]
        notes = [] if same else [f"{op} of {name} {compressor} taken from {p.backend}"]
        return p.time(codec_units(name, k, n, op)), notes
    if _kernel(model, compressor, op, device) is not None or compressor == FP32:
        return _codec_from_kernels(model, scheme, compressor, k, n, op, device)
    # Last resort: the per-element cost another scheme measured for this compressor.
    other = [p for p in model.phases if (p.compressor, p.op) == (compressor, op)]
    if other and name in ("simulated-lowprec", "allgather"):
        p = sorted(other, key=lambda p: (p.backend != backend, p.scheme))[0]
        units = codec_units(name, k, n, op)
        return p.time(units), [f"{op} of {name} {compressor} per element from {p.scheme}"]
    return _codec_from_kernels(model, scheme, compressor, k, n, op, device)


def _codec_from_kernels(
    model: CostModel, scheme: Scheme, compressor: str, k: int, n: float, op: str, device: str
) -> tuple[float, list[str]]:
    kern = _kernel(model, compressor, op, device)
    copy = _kernel(model, "", "copy", device)
    notes = [f"{op} of {scheme.name} {compressor} composed from kernel timings"]
    if kern is None:
        if compressor == FP32:
            return 0.0, [f"{op} of fp32 {scheme.name}: no timings, taken as 0"]
        raise UserError(
            f"no {op} timings for {compressor}: fit with `--kernels FILE.json` from `qbench "
            f"bench kernels --compressor ...` or with bench comm rows of {scheme.name} {compressor}"
        )
    pass_s = copy.time(n) if copy is not None else 0.0  # one elementwise pass (divide, zero)
    name = scheme.name
    if scheme.name == "integer-allreduce":
        notes.append("integer-allreduce codec approximated by the qsgd kernels")
    if op == "encode":
        if name == "reduce-broadcast":
            return kern.time((k + 1) * n / k, calls=k + 1), notes
        return kern.time(n), notes
    if name == "reduce-broadcast":
        return kern.time(2 * n, calls=2 * k) + pass_s, notes
    if name == "allgather":
        return kern.time(k * n, calls=k) + pass_s, notes
    if name == "allreduce":
        return kern.time(n) + pass_s, notes
    return kern.time(n), notes


def _compute(model: CostModel, cfg: Config, numel: int) -> tuple[float, float, int | None, bool]:
    """(compute, step, batch size, shared) of a configuration: given, or from the workload's
    fit, measured at the same world size on a like host where it can (``shared``: CPU sharing
    already in the times), else per rank on a core of its own."""
    fit_ = None
    if cfg.workload is not None:
        cands = [c for c in compute_fits(model, cfg.workload) if c.device == cfg.device]
        if cfg.batch_size is not None:
            cands = [c for c in cands if c.batch_size == cfg.batch_size]
        if len({c.batch_size for c in cands}) > 1:
            sizes = ", ".join(str(b) for b in sorted({c.batch_size for c in cands}))
            raise UserError(f"{cfg.workload}: fitted at batch sizes {sizes}; pick one")
        if cands:
            fit_ = cands[0]
        elif cfg.compute_s is None:
            have = sorted({f"{c.workload}@{c.batch_size}" for c in model.compute})
            raise UserError(
                f"no compute fit for {cfg.workload} (batch {cfg.batch_size}, {cfg.device}); "
                f"fitted: {', '.join(have) or 'none'}; give the compute time instead"
            )
    given = cfg.compute_s is not None or cfg.step_s is not None
    at_k = fit_.at(cfg.world_size, cfg.host_cores) if fit_ is not None and not given else None
    if cfg.compute_s is not None:
        compute = cfg.compute_s
    elif fit_ is None:
        compute = 0.0
    else:
        compute = at_k[0] if at_k is not None else fit_.compute_s
    if cfg.step_s is not None:
        step = cfg.step_s
    elif fit_ is None:
        step = 0.0
    else:
        per = at_k[1] / max(fit_.numel, 1) if at_k is not None else fit_.step_s_per_element
        step = per * numel
    return compute, step, fit_.batch_size if fit_ else cfg.batch_size, at_k is not None


def _numel(model: CostModel, cfg: Config) -> int:
    if cfg.numel is not None:
        return cfg.numel
    for c in compute_fits(model, cfg.workload or ""):
        return c.numel
    raise UserError("gradient size unknown: give the model's element count (e.g. 61M)")


def predict(model: CostModel, cfg: Config) -> Prediction:
    """Iteration time breakdown of one configuration (formulas in the module docstring)."""
    scheme = Scheme.parse(cfg.scheme)
    if (why := incompatibility(scheme, cfg.compressor)) is not None:
        raise UserError(why)
    k = cfg.world_size
    if k < 1:
        raise UserError(f"world size must be >= 1, got {k}")
    numel = _numel(model, cfg)
    compute, step, batch, shared = _compute(model, cfg, numel)
    notes: list[str] = []
    groups = [(cfg.compressor, numel - cfg.fp32_numel)]
    if cfg.fp32_numel > 0 and cfg.compressor != FP32:
        groups.append((FP32, cfg.fp32_numel))
    enc = dec = comm = wire = 0.0
    for comp, n in groups:
        if n <= 0:
            continue
        bits = _bits(model, cfg) if comp == cfg.compressor else 32.0
        for op in ("encode", "decode"):
            t, why_ = _codec(model, cfg.backend, scheme, comp, k, n, op, cfg.device)
            notes += why_
            if op == "encode":
                enc += t
            else:
                dec += t
        if k > 1:
            item = comm_plan(scheme, comp, k, n, bits, cfg.backend)
            coll, why_ = _collective(model, cfg.backend, cfg.network, item.collective)
            notes += why_
            comm += coll.time(item.msgs, item.calls, cfg.network, cfg.tbf_burst)
            wire += item.wire
    if k == 1:
        comm = model.solo_comm.get(solo_key(cfg.backend, scheme.label, cfg.workload), 0.0)
    cpu = max(1.0, k / cfg.host_cores) if cfg.host_cores else 1.0
    if not shared:
        compute, step = compute * cpu, step * cpu
    enc, dec = enc * cpu, dec * cpu
    if scheme.overlap > 1:
        agg = max(enc + dec, comm) + (enc + dec) / scheme.overlap
    else:
        agg = enc + comm + dec
    ratio, why_ = _lag(model, cfg.backend, scheme, k)
    notes += why_
    wait = (ratio - 1) * (compute + agg + step)
    return Prediction(
        config=replace(cfg, numel=numel, batch_size=batch), mode=scheme.mode,
        compute_s=compute, encode_s=enc, comm_s=comm, decode_s=dec, step_s=step,
        total_s=compute + agg + step + wait, wire_bytes=wire, wait_s=wait,
        notes=tuple(dict.fromkeys(notes)),
    )  # fmt: skip


def _lag(model: CostModel, backend: str, scheme: Scheme, k: int) -> tuple[float, list[str]]:
    """The imbalance ratio for K ranks: fitted at K, else at the nearest fitted K (log scale,
    the larger on ties), else 1."""
    if k < 2 or scheme.overlap > 1 or not model.imbalance:
        return 1.0, []
    got = model.imbalance.get(imbalance_key(backend, scheme.label, k))
    if got is not None:
        return got, []
    split = (key.rsplit("/", 2) for key in model.imbalance)
    ks = [int(j) for b, name, j in split if (b, name) == (backend, scheme.label)]
    if not ks:
        return 1.0, []
    near = min(ks, key=lambda j: (abs(math.log(j / k)), -j))
    return model.imbalance[imbalance_key(backend, scheme.label, near)], [
        f"{backend} {scheme.label} imbalance at {k} ranks taken from {near}"
    ]


PREDICTION_COLUMNS = (
    *("backend", "network", "world_size", "numel", "workload", "scheme", "compressor", "mode"),
    *("compute_s", "encode_s", "comm_s", "decode_s", "step_s", "wait_s", "total_s", "wire_bytes"),
    *("speedup_vs_fp32", "scalability", "samples_per_s", "notes"),
)


def predict_frame(model: CostModel, configs: Sequence[Config]) -> pd.DataFrame:
    """Predictions as a table, with the speedup over fp32 allreduce (same backend, link, K,
    size and compute) and the scalability (K t(1) / t(K): throughput at K ranks over 1 rank of
    the same configuration, per-rank batch fixed)."""
    rows = []
    for cfg in configs:
        p = predict(model, cfg)
        base = predict(model, replace(cfg, scheme="allreduce", compressor=FP32, bits_per_value=None,
                                      fp32_numel=0))  # fmt: skip
        one = predict(model, replace(cfg, world_size=1))
        c = p.config
        batch = c.batch_size or 1
        rows.append({
            "backend": c.backend, "network": c.network, "world_size": c.world_size,
            "numel": c.numel, "workload": c.workload or "", "scheme": Scheme.parse(c.scheme).label,
            "compressor": c.compressor, "mode": p.mode, "compute_s": p.compute_s,
            "encode_s": p.encode_s, "comm_s": p.comm_s, "decode_s": p.decode_s,
            "step_s": p.step_s, "wait_s": p.wait_s, "total_s": p.total_s,
            "wire_bytes": p.wire_bytes,
            "speedup_vs_fp32": base.total_s / p.total_s if p.total_s > 0 else math.nan,
            "scalability": c.world_size * one.total_s / p.total_s if p.total_s > 0 else math.nan,
            "samples_per_s": c.world_size * batch / p.total_s if p.total_s > 0 else math.nan,
            "notes": "; ".join(p.notes),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS))


# -- validation ----------------------------------------------------------------------------------
VALIDATION_COLUMNS = (
    *("source", "kind", "backend", "network", "world_size", "scheme", "compressor", "numel"),
    *("workload", "measured_s", "predicted_s", "error", "measured_comm_s", "predicted_comm_s"),
    *("runs", "in_fit", "notes"),
)


def validate_comm(model: CostModel, doc: Any, source: str) -> pd.DataFrame:
    """Predicted vs measured time of every bench comm row the model can predict (one aggregation,
    no compute): error = predicted / measured - 1. All ranks of a bench launch share the host
    its ``machine.cores`` describes, so codec times scale by max(1, K / cores)."""
    used = set(model.used)
    machine = doc.get("machine") if isinstance(doc.get("machine"), dict) else None
    cores = machine.get("cores") if machine else None
    out = []
    for r in comm_rows(doc, source):
        try:
            cfg = Config(
                scheme=r["scheme"], compressor=r["compressor"], bits_per_value=_row_bits(r),
                backend=r["backend"], network=r["network"], world_size=int(r["world_size"]),
                numel=int(r["bytes"]) // 4, compute_s=0.0, step_s=0.0,
                host_cores=cores if isinstance(cores, int) and cores > 0 else None,
            )  # fmt: skip
            p = predict(model, cfg)
        except UserError as e:
            model_note = str(e)
            out.append(_vrow(source, "bench", r, None, float(r["time_s"]), None, model_note,
                             bench_key(r) in used))  # fmt: skip
            continue
        out.append(_vrow(source, "bench", r, p, float(r["time_s"]), _nan(r.get("t_comm_s")),
                         "; ".join(p.notes), bench_key(r) in used))  # fmt: skip
    return pd.DataFrame(out, columns=list(VALIDATION_COLUMNS))


def validate_runs(model: CostModel, root: Path | str) -> pd.DataFrame:
    """Predicted vs measured median iteration time of every configuration of a results
    directory: runs that differ only in seed or repeat are one row, measured = the median over
    them (``runs``), so that run-to-run noise on a shared machine averages out."""
    rows = _validate_each_run(model, root)
    if not rows:
        return pd.DataFrame(columns=list(VALIDATION_COLUMNS))
    groups: dict[Any, list[dict[str, Any]]] = {}
    for key, row in rows:
        groups.setdefault(key, []).append(row)
    out = []
    for members in groups.values():
        first = dict(members[0])
        measured = float(np.median([m["measured_s"] for m in members]))
        comm = float(np.median([m["measured_comm_s"] for m in members]))
        pred = first["predicted_s"]
        first.update(
            measured_s=measured, measured_comm_s=comm, runs=len(members),
            error=pred / measured - 1 if measured > 0 else math.nan,
            in_fit=any(m["in_fit"] for m in members),
        )  # fmt: skip
        out.append(first)
    return pd.DataFrame(out, columns=list(VALIDATION_COLUMNS))


def _validate_each_run(model: CostModel, root: Path | str) -> list[tuple[Any, dict[str, Any]]]:
    """(configuration key, validation row) per ok run."""
    table = run_table(root)
    used = set(model.used)
    out: list[tuple[Any, dict[str, Any]]] = []
    for r in table.itertuples(index=False):
        labels = {
            "backend": r.backend, "network": r.network, "world_size": int(r.world_size),
            "scheme": r.scheme, "compressor": r.compressor, "bytes": 4 * int(r.grad_bytes // 4),
            "workload": r.workload,
        }  # fmt: skip
        got = _run_config(r, model)
        in_fit = run_key(str(r.run_id)) in used
        key = (tuple(labels.values()), got[1] if got is not None else str(r.run_id))
        if got is None:
            out.append((key, _vrow(str(root), "run", labels, None, float(r.t_iteration), None,
                                   f"no model for scheme {r.scheme}", in_fit)))  # fmt: skip
            continue
        try:
            p = predict(model, got[1])
        except UserError as e:
            out.append((key, _vrow(str(root), "run", labels, None, float(r.t_iteration), None,
                                   str(e), in_fit)))  # fmt: skip
            continue
        out.append((key, _vrow(str(root), "run", labels, p, float(r.t_iteration),
                               float(r.t_comm), "; ".join(p.notes), in_fit)))  # fmt: skip
    return out


def _vrow(
    source: str, kind: str, r: dict[str, Any], p: Prediction | None, measured: float,
    measured_comm: float | None, notes: str, in_fit: bool,
) -> dict[str, Any]:  # fmt: skip
    pred = p.total_s if p is not None else math.nan
    return {
        "source": source, "kind": kind, "backend": r["backend"], "network": r["network"],
        "world_size": int(r["world_size"]), "scheme": r["scheme"], "compressor": r["compressor"],
        "numel": int(r["bytes"]) // 4, "workload": r.get("workload") or "",
        "measured_s": measured, "predicted_s": pred,
        "error": pred / measured - 1 if measured > 0 else math.nan,
        "measured_comm_s": math.nan if measured_comm is None else measured_comm,
        "predicted_comm_s": p.comm_s if p is not None else math.nan,
        "runs": 1, "in_fit": in_fit, "notes": notes,
    }  # fmt: skip


def validate(model: CostModel, paths: Sequence[Path | str]) -> pd.DataFrame:
    """Validation table over bench comm JSON files and results directories."""
    frames = []
    for path in paths:
        kind, obj = load_input(path)
        if kind == "comm":
            frames.append(validate_comm(model, obj, str(path)))
        elif kind == "runs":
            frames.append(validate_runs(model, obj))
        else:
            raise UserError(f"{path}: kernel timings have no iteration time to validate against")
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(VALIDATION_COLUMNS))
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class ValidationSummary:
    points: int
    """Held-out rows with a prediction."""
    median_abs_error: float
    max_abs_error: float
    within_target: int
    target: float = TARGET_ERROR

    @property
    def passed(self) -> bool:
        return self.points > 0 and self.within_target == self.points


def summarize_validation(table: pd.DataFrame, target: float = TARGET_ERROR) -> ValidationSummary:
    """Errors over the rows NOT used for fitting (the target: |error| <= 15 %)."""
    held = table[~table["in_fit"].astype(bool) & table["error"].notna()]
    err = held["error"].abs().to_numpy(dtype=float)
    if err.size == 0:
        return ValidationSummary(0, math.nan, math.nan, 0, target)
    return ValidationSummary(
        int(err.size), float(np.median(err)), float(err.max()), int((err <= target).sum()), target
    )


def _comm_items(scheme: Scheme, cfg: Config) -> list[CommItem]:
    n = cfg.numel or 0
    items = [
        comm_plan(scheme, cfg.compressor, cfg.world_size, n - cfg.fp32_numel,
                  cfg.bits_per_value or 32.0, cfg.backend)
    ]  # fmt: skip
    if cfg.fp32_numel > 0 and cfg.compressor != FP32:
        items.append(comm_plan(scheme, FP32, cfg.world_size, cfg.fp32_numel, 32.0, cfg.backend))
    return items
