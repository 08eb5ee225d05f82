"""The fitted cost model: its parameters as dataclasses, saved to and loaded from JSON.

``CostModel`` holds every fit (``qbench.costmodel.fit`` makes one, ``qbench cost fit`` writes
it): alpha-beta per collective (``CollectiveFit``), codec phases and kernels (``CodecFit``),
compute per workload (``ComputeFit``), the imbalance ratios and 1-rank comm times, with the
keys of every measurement it used (so that ``validate`` can tell held-out rows apart).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qbench.costmodel.formulas import burst_s, comm_time, scale_beta
from qbench.costmodel.inputs import read_json
from qbench.errors import UserError
from qbench.records.store import atomic_write_json, strict_json
from qbench.spec import network as network_mod
from qbench.spec.network import Link

SCHEMA = "qbench.costmodel/1"


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
    def link(self) -> Link:
        """The fitted link. The model's JSON names it by the label its measurements recorded
        (``1gbit``, ``unshaped``), read back here by the network spec's own parser."""
        return network_mod.option(self.network)

    @property
    def bandwidth_bps(self) -> float | None:
        return self.link.bits_per_s

    def time(
        self, msgs: float, calls: Sequence[float], link: Link | None = None, tbf: bool = True
    ) -> float:
        """Seconds on ``link`` (default: the fitted one): beta scaled by the rate, the credit
        capped by that link's burst (0 with ``tbf=False``: a real link, no shaper)."""
        link = link or self.link
        beta = self.beta_s_per_byte
        if link.label != self.network:
            old, new = self.bandwidth_bps, link.bits_per_s
            if old is None or new is None:
                raise UserError(f"cannot scale a {self.network} fit to a {link.label} link")
            beta = scale_beta(beta, old, new)
        credit = min(self.credit_s, burst_s(link)) if tbf else 0.0
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


@dataclass(frozen=True, kw_only=True)
class BucketProfile:
    """A workload's DDP buckets as one DDP run measured them (``qbench.costmodel.overlap``):
    enough to predict any link, compressor and per-bucket exchange of that model."""

    workload: str
    batch_size: int
    device: str
    world_size: int
    bucket_cap_mb: float
    numel: list[int]
    """Gradient values of each bucket, in hand-over order (DDP's bucket index)."""
    handed_s: list[float]
    """Median instant each bucket was handed over, seconds after backward started."""
    forward_s: float
    backward_s: float
    """Backward compute: t_compute - t_forward (until the last hand-over)."""
    step_s: float
    imbalance: float = 1.0
    """Median of t_iteration (slowest rank) / (t_compute + t_comm + t_step) (rank means), >= 1."""
    host_cores: int | None = None
    """Cores of the host the runs shared (None: GPU or unknown)."""
    runs: int
    measured: str
    """Which runs the times come from: ``scheme compressor link`` (fp32 ddp unshaped first)."""
    payload_bytes: dict[str, list[float]] = field(default_factory=dict)
    """PowerSGD label -> each bucket's median payload in bytes (its size depends on the shapes
    of the bucket's matrices, so it is measured)."""
    local_s: dict[str, float] = field(default_factory=dict)
    """PowerSGD label -> its local work per iteration at the profile's CPU share (matrix
    products, orthogonalisation and, on CPU ranks, their contention with backward): the
    median excess of its fitted runs over the model without it (``qbench.costmodel.powersgd``)."""


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
    buckets: list[BucketProfile] = field(default_factory=list)
    """Per workload (and world size), the DDP bucket profile of ``overlap: backward`` runs."""
    topologies: list[str] = field(default_factory=list)
    """``NxG`` (nodes x ranks per node) of the fitted runs that had a topology: predictions for
    others say they extrapolate (``qbench.costmodel.levels``)."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["topologies"]:  # one-level models are written as before issue 33
            del d["topologies"]
        return strict_json({"schema": SCHEMA, **d})

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "model") -> CostModel:
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise UserError(
                f"{source}: not a fitted cost model (schema {got!r}, expected {SCHEMA!r}); "
                "write one with `qbench cost fit`"
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
                buckets=[BucketProfile(**b) for b in d.get("buckets", [])],
                topologies=[str(t) for t in d.get("topologies", [])],
            )
        except (TypeError, ValueError) as e:
            raise UserError(f"{source}: malformed cost model ({e}); fit it again") from None

    def save(self, path: Path | str) -> None:
        atomic_write_json(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: Path | str) -> CostModel:
        return cls.from_dict(read_json(Path(path)), str(path))

    @property
    def backends(self) -> list[str]:
        return sorted({c.backend for c in self.collectives})

    @property
    def networks(self) -> list[str]:
        return sorted({c.network for c in self.collectives})

    @property
    def links(self) -> list[Link]:
        """The fitted links, in ``networks`` order."""
        return [network_mod.option(n) for n in self.networks]


def compute_fits(model: CostModel, workload: str) -> list[ComputeFit]:
    """Fits of a workload: by its full name, else by model name when only one workload has it
    (``synthetic`` for ``synthetic(params=...)``)."""
    exact = [c for c in model.compute if c.workload == workload]
    if exact:
        return exact
    named = [c for c in model.compute if c.workload.split("(")[0] == workload]
    return named if len({c.workload for c in named}) == 1 else []


def imbalance_key(backend: str, scheme: str, k: int) -> str:
    return f"{backend}/{scheme}/{k}"


def solo_key(backend: str, scheme: str, workload: str | None) -> str:
    return f"{backend}/{scheme}/{workload}"
