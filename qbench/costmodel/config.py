"""One configuration to predict: scheme, compressor, link, ranks, gradient size, workload."""

from __future__ import annotations

from dataclasses import dataclass

from qbench.costmodel.schemes import FP32


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
