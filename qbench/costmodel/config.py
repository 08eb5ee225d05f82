"""One configuration to predict (scheme, compressor, link, ranks, gradient size, workload), and
its prediction."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from qbench import catalog
from qbench.costmodel.schemes import ALLREDUCE, NONE, Scheme
from qbench.spec.network import Link, Topology

GBIT = Link(1e9, "1gbit")
"""The default link: 1 Gbit/s, the rate of the shipped emulated-link scenarios."""


@dataclass(frozen=True, kw_only=True)
class Config:
    """One configuration to predict. numel None: the workload's fitted gradient size."""

    scheme: Scheme = ALLREDUCE
    """The scheme as the model sees it (``Scheme.of`` a catalog spec)."""
    compressor: catalog.CompressorSpec = NONE
    """The compressor's catalog spec (what it is and sends); its label keys the model's fits."""
    bits_per_value: float | None = None
    """Wire bits per value of the compressor; None: from its spec or the model's inputs."""
    backend: str = "gloo"
    network: Link = GBIT
    """The link (``qbench.spec.network``): its rate scales the fitted beta, its label finds the
    fits measured on it."""
    world_size: int = 2
    topology: Topology | None = None
    """Nodes x ranks per node with their intra and inter links (``qbench.costmodel.levels``);
    None: one level, every rank on ``network`` (its ``world_size`` and ``network`` then
    repeat the topology's world size and inter link)."""
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
    replayed_compute: bool = False
    """Compute and step were slept through (``compute: replay``): they use no CPU, so ranks
    sharing ``host_cores`` do not slow them; codecs still run, and still share."""
    tbf_burst: bool = True
    """Shaped links are qbench's tbf emulation, whose bucket lets each call start with a burst;
    False for real links (no credit)."""
    overlap: str | None = None
    """``backward``: per DDP bucket during backward (``qbench.costmodel.overlap``); ``none``: one
    flat gradient after it; None: as the scheme says (``ddp`` and ``backward: true`` overlap)."""


def on_link(cfg: Config, link: Link) -> Config:
    """The configuration with ``link`` between its hosts (a topology's inter link)."""
    topo = cfg.topology
    return replace(cfg, network=link, topology=None if topo is None else replace(topo, inter=link))


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
    comm_total_s: float = math.nan
    """Seconds with communication under way, hidden or not (DDP; flat: ``comm_s``)."""
    codec_total_s: float = math.nan
    """Encode + decode of every bucket (DDP, where they run beside backward; flat: the sum)."""
    notes: tuple[str, ...] = ()

    @property
    def aggregate_s(self) -> float:
        return self.total_s - self.compute_s - self.step_s
