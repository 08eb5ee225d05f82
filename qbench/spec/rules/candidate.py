"""The planned run as the rules see it: every choice a rule may read, typed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qbench import catalog


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One combination of the scenario's axes, with the scenario-wide settings rules read.

    Callers outside the planner (bench comm, the cost model, the DDP hook) fill what they know;
    a rule whose inputs keep their defaults passes.
    """

    backend: str
    scheme: str
    """Canonical scheme name (``catalog.spelling.canonical`` applied)."""
    compressor: catalog.CompressorSpec
    params: dict[str, Any] = field(default_factory=dict)
    """The scheme's parameters as given (canonical)."""
    overrides: tuple[catalog.CompressorSpec, ...] = ()
    """Compressors of the layer policy's overrides (they run under the same scheme)."""
    world_size: int | None = None
    nodes: int = 1
    network: dict[str, Any] = field(default_factory=dict)
    """The scenario's ``network:`` entry ({}: the machine's own links)."""
    launcher: str = "local"
    device: str = "auto"
    """As the scenario wrote it: auto, cpu or cuda."""
    gpus_per_node: int | None = None
    accuracy: bool = False
    """Accuracy mode (``epochs:``): the run must train."""
    momentum: float = 0.0
    optimizer: str = ""
    """The scenario's ``optimizer:`` by name; "" when it has none (SGD)."""
    telemetry: bool = False
    profile: bool = False
    """Profiler traces asked for (``profile: true``)."""
    compute: str = "fp32"
    dilation: float = 1.0
    codec_time: str = ""
    """Path of a ``bench kernels`` JSON whose codec times replay ("": measured)."""
    weight_bits: int = 0
    model: str = ""
    """Catalog model name ("": no model, as for bench comm)."""
    model_params: dict[str, Any] = field(default_factory=dict)
    factory: bool = False
    """The model comes from a user's workload factory (its shape is its own)."""
    dataset: str = ""
    skew: float = 0.0
    collective: bool = False
    """Timed as one collective call (``bench comm``): the scheme must produce a mean."""
    compressors: tuple[catalog.CompressorSpec, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compressors", (self.compressor, *self.overrides))
