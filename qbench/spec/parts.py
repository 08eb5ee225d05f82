"""The parts of a run's one value (``qbench.spec.runspec.RunSpec``), each a frozen dataclass.

A run is what it trains (:class:`Workload`), how its gradients travel (:class:`Method`), where
its ranks are (:class:`Placement`), how it computes (:class:`Compute`, with :class:`Replay`
when its compute is replayed) and what is measured (:class:`Measurement`). Closed sets are
``Literal`` types, and the tuples the scenario checks against are read from them; compressors
and schemes are the catalog's validated specs; the network is a checked ``Network``. Dicts are
left only where a user's factory takes parameters of its own (a model, dataset, optimizer or
loss factory, a zoo model's parameters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from qbench import catalog
from qbench.spec import network as net
from qbench.spec.layers import LayerPolicy
from qbench.spec.rules.devices import natural_device

Backend = Literal["gloo", "mpi", "nccl"]
Device = Literal["", "cpu", "cuda"]
"""Where the ranks compute; ``""``: the backend's own (cuda for nccl, cpu otherwise)."""
Precision = Literal["fp32", "bf16", "fp16", "int8", "int8-asym"]
Norm = Literal["batchnorm", "range-evonorm", "range-evonorm-gs2"]
Rounding = Literal["per-rank", "shared"]
Nonfinite = Literal["fail", "skip"]
REPLAY = "replay"
"""``compute: replay`` in a scenario and a record: fp32 compute replayed (:class:`Replay`)."""

BACKENDS: tuple[str, ...] = get_args(Backend)
PRECISIONS: tuple[str, ...] = get_args(Precision)
NORMS: tuple[str, ...] = get_args(Norm)
ROUNDINGS: tuple[str, ...] = get_args(Rounding)
NONFINITE: tuple[str, ...] = get_args(Nonfinite)
Factory = Mapping[str, Any]
"""A user factory's spec as the scenario gave it (``qbench.catalog.workloads``); empty: none."""


@dataclass(frozen=True, kw_only=True)
class LrSchedule:
    """Step decay of the learning rate by epoch (scenario ``lr_schedule``, checked by
    ``qbench.spec.checks``); all None: a constant rate. What is unset stays unset, so that
    :meth:`written` gives back the mapping the run id has always hashed."""

    milestones: tuple[int, ...] | None = None
    """Times ``gamma`` at each of these epochs passed (seed 001's ResNet schedule)."""
    every: int | None = None
    """Times ``gamma`` every this many epochs (seed 001's VGG schedule)."""
    gamma: float | None = None
    """The factor; 0.1 when unset."""

    @classmethod
    def of(cls, written: Mapping[str, Any]) -> LrSchedule:
        ms = written.get("milestones")
        return cls(milestones=None if ms is None else tuple(ms), every=written.get("every"),
                   gamma=written.get("gamma"))  # fmt: skip

    def written(self) -> dict[str, Any]:
        """As a scenario writes it: the keys that are set."""
        d = {"milestones": None if self.milestones is None else list(self.milestones),
             "every": self.every, "gamma": self.gamma}  # fmt: skip
        return {k: v for k, v in d.items() if v is not None}

    def lr(self, base: float, epoch: int) -> float:
        """The learning rate of ``epoch`` (0-based)."""
        gamma = 0.1 if self.gamma is None else float(self.gamma)
        if self.milestones is not None:
            return base * gamma ** sum(epoch >= m for m in self.milestones)
        if self.every is not None:
            return base * gamma ** (epoch // self.every)
        return base


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What the run trains and with which optimizer."""

    model: str
    """The zoo model's name, or a factory's label (``factory`` then says which)."""
    dataset: str
    """A built-in dataset, or a factory's label (``data``)."""
    batch_size: int
    """Per rank."""
    lr: float
    momentum: float
    weight_decay: float = 0.0
    model_params: Factory = field(default_factory=dict)
    """The zoo model's parameters (e.g. the synthetic model's size); empty: its defaults."""
    factory: Factory = field(default_factory=dict)
    """A model factory (scenario ``model: {factory: ...}``); empty: the zoo's ``model``."""
    data: Factory = field(default_factory=dict)
    """A dataset factory; empty: the built-in ``dataset``."""
    optimizer: Factory = field(default_factory=dict)
    """An optimizer other than SGD: name and parameters besides lr, momentum, weight_decay."""
    loss: Factory = field(default_factory=dict)
    """A loss other than cross entropy (``qbench.catalog.workloads.loss``)."""
    lr_schedule: LrSchedule = field(default_factory=LrSchedule)
    skew: float = 0.0
    """Label skew of the training partitions (0 = IID)."""
    target_accuracy: float | None = None
    """Top-1 accuracy for time-to-accuracy in reports (not part of the run id)."""


@dataclass(frozen=True, kw_only=True)
class Method:
    """How the gradients travel: the scheme, the compressor and its per-layer policy."""

    scheme: catalog.SchemeSpec
    """Resolved (``auto``) and canonical (``catalog.schemes.spelling``)."""
    compressor: catalog.CompressorSpec
    layers: LayerPolicy | None = None
    """None for fp32 runs without overrides: nothing to decide."""

    @property
    def scheme_label(self) -> str:
        """The scheme plus its parameters, e.g. ``reduce-broadcast+overlap4``."""
        return catalog.scheme_label(self.scheme.name, self.scheme_params)

    @property
    def scheme_params(self) -> dict[str, Any]:
        """The scheme's parameters as written (what the run id hashes)."""
        return {k: v for k, v in self.scheme.given.items() if k != "name"}


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where the ranks are and what joins them."""

    backend: Backend
    world_size: int
    device: Device = ""
    nodes: int = 1
    """Hosts the ranks are spread over."""
    network: net.Network = field(default_factory=net.Network)
    """Unshaped unless set."""
    price_per_hour: float | None = None
    """Machine-hour price for cost columns (not part of the run id)."""

    @property
    def device_kind(self) -> str:
        """Where the ranks compute: cuda or cpu."""
        return self.device or natural_device(self.backend)

    @property
    def topology(self) -> net.Topology:
        """Nodes, ranks per node and the links between and inside them."""
        return self.network.topology(self.world_size, self.nodes)


@dataclass(frozen=True, kw_only=True)
class Replay:
    """Replayed compute (``qbench.run.replay``): the run's clock. Under dilation D the links
    are shaped at rate / D, replayed compute and codec time stretch D times, and the measured
    times are divided by D again; all three read ``dilation`` from here."""

    timeline: str = ""
    """A supplied timeline (absolute path); empty: measured by the sweep's first run."""
    codec_time: str = ""
    """A ``bench kernels --json`` file (absolute path) whose codec times the flat loop's codec
    calls replay; empty: the real codec's time."""
    dilation: float = 1.0

    def stretched(self, seconds: float) -> float:
        """Seconds of replayed work as the dilated clock runs them."""
        return seconds * self.dilation

    @property
    def stretch(self) -> Callable[[float], float] | None:
        """:meth:`stretched`, or None when the clock is not dilated (nothing to stretch)."""
        return self.stretched if self.dilation != 1 else None

    def undone(self, seconds: float) -> float:
        """Seconds measured on the dilated clock, as the run stands for them."""
        return seconds / self.dilation

    def shaped(self, topo: net.Topology) -> net.Topology:
        """The links as shaped: each rate divided by the dilation."""
        return net.dilated(topo, self.dilation)


@dataclass(frozen=True, kw_only=True)
class Compute:
    """How the ranks compute."""

    precision: Precision = "fp32"
    """fp32, bf16 / fp16 autocast, or int8 fake-quantized (``qbench.run.precision``)."""
    replay: Replay | None = None
    """Set when compute is replayed (fp32 compute stood for by sleeps)."""
    norm: Norm = "batchnorm"
    weight_bits: int = 0
    """Quantize all parameters to this many bits after each step (0: no)."""
    rounding: Rounding = "per-rank"
    """Stochastic rounding's draws (``qbench.run.rounding``); always ``per-rank`` in a run that
    rounds nothing stochastically."""

    @property
    def name(self) -> str:
        """As scenarios and records write it: the precision, or ``replay``."""
        return REPLAY if self.replay else self.precision


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What is measured, and for how long."""

    warmup: int
    iterations: int
    seed: int
    timeout: float
    epochs: int = 0
    """Accuracy mode: passes over the training split (0 = iteration mode, ``iterations``)."""
    steps_per_epoch: int = 0
    """Accuracy mode: at most this many steps per epoch (0: all)."""
    repeat: int = 0
    """Repetition index of an otherwise identical run (scenario ``repeats``)."""
    telemetry: bool = False
    profile: bool = False
    """Profiler traces (``qbench.run.profile``); labelled ``profiled``."""
    nonfinite: Nonfinite = "fail"
    """A NaN or inf in a gradient fails the run (``fail``) or skips the step (``skip``)."""
