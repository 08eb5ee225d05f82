"""Scenario YAML -> frozen, validated dataclasses. Every bad key or value is rejected here.

Scalars or lists are accepted for every sweep axis; a list means "sweep over these".
Errors are :class:`qbench.errors.UserError` with one line naming the key, the value and a fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from qbench import layers, network
from qbench.errors import UserError

BACKENDS = ("gloo", "mpi", "nccl")
LAUNCHERS = ("local", "slurm")
DEVICES = ("auto", "cpu", "cuda")
# Keys an include / exclude entry may match on (values: one value or a list of values).
FILTER_KEYS = (
    "model", "dataset", "world_size", "nodes", "backend", "device", "scheme", "compressor",
    "network", "seed", "repeat", "skew", "compute",
)  # fmt: skip
# qbench.precision.COMPUTE and NORMS (no torch import here)
COMPUTE = ("fp32", "bf16", "fp16", "int8", "int8-asym")
NORMS = ("batchnorm", "range-evonorm", "range-evonorm-gs2")
LR_SCHEDULE_KEYS = ("milestones", "every", "gamma")


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A sweep: the cross-product of its list-valued axes (see README, "Scenario schema")."""

    name: str
    """Sweep name; results go to ``results/<name>/`` unless ``--out`` is given."""
    model: tuple[dict[str, Any], ...]
    """Workloads, each a registry name (``qbench models`` lists them) or
    ``{name: synthetic, params: 25M, gflops: 1}`` with model parameters."""
    dataset: tuple[str, ...] = ("synthetic",)
    """Input data; ``synthetic`` makes random inputs of the model's shape."""
    world_size: tuple[int, ...] = (1, 2)
    """Numbers of ranks (processes) in all; CPU ranks get one thread each."""
    nodes: tuple[int, ...] = (1,)
    """Hosts the ranks are spread over (world_size / nodes each); > 1 needs ``launcher: slurm``
    or a multi-node set-up (see docs/launchers.md)."""
    gpus_per_node: int | None = None
    """GPUs each host offers (nccl: ranks per node must not exceed it); none = not checked."""
    backend: tuple[str, ...] = ("gloo",)
    """Communication library: gloo (torch.distributed), mpi (mpi4py), nccl (GPUs)."""
    device: tuple[str, ...] = ("auto",)
    """Where each rank computes: ``auto`` (cuda for nccl, cpu otherwise), ``cpu`` or ``cuda``
    (mpi stages GPU tensors through host memory)."""
    scheme: tuple[dict[str, Any], ...] = ({"name": "auto"},)
    """Aggregation schemes, each a name or ``{name: ..., <parameter>: ...}``; ``auto`` is
    allreduce for fp32 and reduce-broadcast otherwise."""
    compressor: tuple[dict[str, Any], ...] = ({"name": "none"},)
    """Gradient compressors, each ``{name: ..., <parameter>: ...}``."""
    network: tuple[dict[str, Any], ...] = ({},)
    """Links between ranks: ``unshaped`` (empty mapping) or ``{bandwidth: 1gbit}`` (emulated)."""
    batch_size: int | dict[int, int] = 32
    """Per-rank batch size, or a map world_size -> per-rank batch (like seed 002 Figure 4)."""
    warmup: int = 5
    """Iterations run first and kept on disk, but dropped from summaries."""
    iterations: int = 20
    """Measured iterations (iteration mode; ``epochs`` replaces it)."""
    epochs: int | None = None
    """Accuracy mode: train this many passes over the dataset's training split, evaluating on
    the test split after each (needs a real dataset, not ``synthetic``)."""
    lr_schedule: dict[str, Any] = field(default_factory=dict)
    """Learning-rate decay per epoch: ``{milestones: [100, 150], gamma: 0.1}`` or
    ``{every: 30, gamma: 0.5}``; empty = constant."""
    weight_decay: float = 0.0
    """L2 regularisation (SGD weight decay), e.g. seed 000's logistic regression."""
    skew: tuple[float, ...] = (0.0,)
    """Label skew of the ranks' training partitions: 0 = IID, 1 = sorted by label (seed 001)."""
    target_accuracy: float | None = None
    """Top-1 test accuracy for "time to accuracy" in reports (not part of run ids)."""
    compute: tuple[str, ...] = ("fp32",)
    """Compute precision: fp32, bf16 / fp16 autocast (fp16 with loss scaling), or 8-bit
    fake-quantized training (seed 001): ``int8`` symmetric per tensor, ``int8-asym`` Banner et
    al.'s asymmetric min/max."""
    norm: str = "batchnorm"
    """``range-evonorm`` replaces the models' batch norms by Range-EvoNorm as seed 001's
    authors' code computes it; ``range-evonorm-gs2`` by the paper's formula with groups of 2
    channels (qbench.precision)."""
    weights: tuple[dict[str, Any], ...] = ({},)
    """Axis: ``{bits: N}`` quantizes every parameter to N-bit fixed point after each step
    (seed 000 section 5.4); ``none`` (``{}``) leaves the model in fp32."""
    lr: float = 0.05
    """SGD learning rate."""
    momentum: float = 0.9
    """SGD momentum."""
    seed: tuple[int, ...] = (0,)
    """Seeds for model init, data and stochastic rounding; a list sweeps them."""
    repeats: int = 1
    """Identical repetitions of every run (separate run ids ``repeat`` 0..n-1), for noise."""
    include: tuple[dict[str, Any], ...] = ()
    """Keep only runs matching at least one entry, e.g. ``[{backend: mpi, world_size: [2, 4]}]``."""
    exclude: tuple[dict[str, Any], ...] = ()
    """Drop runs matching any entry, e.g. ``[{backend: gloo, compressor: onebit}]``."""
    price_per_hour: float | None = None
    """Price of one machine hour (any currency) for cost per epoch / to accuracy in reports."""
    launcher: str = "local"
    """How runs start: ``local`` (torchrun / mpirun here) or ``slurm``; ``--launcher`` overrides."""
    slurm: dict[str, Any] = field(default_factory=dict)
    """Slurm options (partition, time, account, mode, array, ...; see docs/launchers.md)."""
    timeout: float = 600.0
    """Seconds a run may take before its processes are killed and it is marked timeout."""
    telemetry: bool = False
    """Record per-layer quantization error, residual norm and bits per value (slower)."""
    layers: layers.LayerPolicy = field(default_factory=layers.LayerPolicy)
    """Which tensors travel in full precision, and per-layer compressor overrides."""
    source: str = field(default="<embedded>", compare=False)
    """Where the scenario was read from (not part of any run's identity)."""

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_choices("backend", self.backend, BACKENDS)
        _check_choices("device", self.device, DEVICES)
        for m in self.model:
            if not isinstance(m.get("name"), str):
                raise UserError(
                    f"model {m!r} has no name; e.g. `model: mlp` or "
                    "`- {name: synthetic, params: 25M}`"
                )
        for s in self.scheme:
            if "name" not in s:
                raise UserError(f"scheme {s!r} has no name; e.g. `- {{name: reduce-broadcast}}`")
        for net in self.network:
            network.check(net)
        _check_positive("world_size", self.world_size, example="world_size: [1, 2, 4]")
        _check_positive("nodes", self.nodes, example="nodes: [1, 2]")
        if self.gpus_per_node is not None:
            _check_range("gpus_per_node", self.gpus_per_node, 1, 1024, example="gpus_per_node: 8")
        _check_range("repeats", self.repeats, 1, 1000, example="repeats: 3")
        if self.price_per_hour is not None:
            _check_range(
                "price_per_hour", self.price_per_hour, 0.0, 1e6, example="price_per_hour: 32.77"
            )
        _check_choices("launcher", (self.launcher,), LAUNCHERS)
        for key, entries in (("include", self.include), ("exclude", self.exclude)):
            for entry in entries:
                _check_filter(key, entry)
        _check_batch(self.batch_size, self.world_size)
        for seed in self.seed:
            _check_range("seed", seed, 0, 2**32 - 1, example="seed: [0, 1, 2]")
        _check_range("warmup", self.warmup, 0, 10**6)
        _check_range("iterations", self.iterations, 1, 10**7)
        _check_accuracy_mode(self)
        _check_choices("compute", self.compute, COMPUTE)
        _check_choices("norm", (self.norm,), NORMS)
        for w in self.weights:
            _check_weights(w)
        _check_range("lr", self.lr, 0.0, 1e3, example="lr: 0.05")
        _check_range("momentum", self.momentum, 0.0, 1.0, example="momentum: 0.9")
        _check_range("timeout", self.timeout, 1.0, 1e7, example="timeout: 600")
        for c in self.compressor:
            if "name" not in c:
                raise UserError(f"compressor {c!r} has no name; e.g. `- {{name: qsgd, bits: 4}}`")

    def batch_for(self, world_size: int) -> int:
        if isinstance(self.batch_size, int):
            return self.batch_size
        return self.batch_size[world_size]


# -- loading -------------------------------------------------------------------------------------
_AXES = {
    "dataset": str,
    "world_size": int,
    "nodes": int,
    "backend": str,
    "device": str,
    "seed": int,
    "skew": float,
    "compute": str,
}
_SCALARS = {
    "gpus_per_node": int,
    "repeats": int,
    "price_per_hour": float,
    "launcher": str,
    "warmup": int,
    "iterations": int,
    "epochs": int,
    "weight_decay": float,
    "target_accuracy": float,
    "norm": str,
    "lr": float,
    "momentum": float,
    "timeout": float,
    "telemetry": bool,
}


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"scenario file {str(p)!r} not found; check the path (e.g. scenarios/)")
    return loads(p.read_text(), source=str(p))


def loads(text: str, source: str = "<embedded>") -> Scenario:
    """Parse and validate scenario YAML text."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{source}:{where} is not valid YAML ({problem}); fix the syntax") from None
    except (ValueError, TypeError, OverflowError) as e:  # e.g. a 5000-digit integer
        raise UserError(
            f"{source}: a YAML value cannot be read ({_short(e)}); use an ordinary number or string"
        ) from None
    except RecursionError:
        raise UserError(
            f"{source}: YAML nested too deeply to read; a scenario needs at most a few levels "
            "(e.g. `compressor: [{name: qsgd, bits: 4}]`)"
        ) from None
    try:
        return parse(raw, source=source)
    except RecursionError:
        raise UserError(
            f"{source}: a value is nested too deeply; a scenario needs at most a few levels "
            "(e.g. `world_size: [1, 2]`)"
        ) from None


def with_overrides(text: str, source: str, sets: Sequence[str]) -> str:
    """Scenario text with top-level keys replaced, ``KEY=VALUE`` each (VALUE is YAML:
    ``seed=0``, ``world_size=[1,2,4,8]``, ``backend=nccl``), as ``qbench sweep --set`` gives
    them: the same scenario at another scale or on other hardware. The result is new YAML text
    (kept with the results as the scenario that ran); unknown keys fail later, in ``parse``."""
    if not sets:
        return text
    raw = yaml.safe_load(text) if text.strip() else None
    if not isinstance(raw, dict):
        loads(text, source)  # the usual one-line error for text that is not a scenario
        raise UserError(f"{source}: a scenario must be a YAML mapping of keys")
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. --set seed=0")
        try:
            raw[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UserError(
                f"--set {item!r}: the value is not valid YAML; quote it, e.g. --set 'seed=[0, 1]'"
            ) from None
    note = f"# {source} with --set {' '.join(sets)}\n"
    return note + yaml.safe_dump(raw, sort_keys=False)


def _short(e: BaseException, limit: int = 80) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse(raw: Any, source: str = "<embedded>") -> Scenario:
    """Validate a parsed YAML mapping into a Scenario."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: a scenario must be a YAML mapping of keys, got {_kind(raw)}")
    valid = [f.name for f in fields(Scenario) if f.name != "source"]
    unknown = sorted(str(k) for k in raw if k not in valid)
    if unknown:
        hint = _close_match(unknown[0], valid)
        raise UserError(
            f"{source}: unknown key {unknown[0]!r}{hint}; valid keys: {', '.join(valid)}"
        )
    if "name" not in raw or "model" not in raw:
        missing = "name" if "name" not in raw else "model"
        raise UserError(f"{source}: missing required key {missing!r}; e.g. `name: smoke`")
    kw: dict[str, Any] = {"name": _typed("name", raw["name"], str), "source": source}
    for key, typ in _AXES.items():
        if key in raw:
            kw[key] = tuple(_typed(key, v, typ) for v in _as_list(key, raw[key]))
    for key, typ in _SCALARS.items():
        if key in raw:
            kw[key] = _typed(key, raw[key], typ)
    for key in ("model", "compressor", "scheme"):
        if key in raw:
            kw[key] = tuple(_named(key, c) for c in _as_list(key, raw[key]))
    if "network" in raw:
        kw["network"] = tuple(network.parse(n) for n in _as_list("network", raw["network"]))
    if "batch_size" in raw:
        kw["batch_size"] = _batch(raw["batch_size"])
    if "layers" in raw:
        kw["layers"] = layers.parse(raw["layers"])
    for key in ("include", "exclude"):
        if key in raw:
            kw[key] = tuple(_mapping(key, e) for e in _as_list(key, raw[key]))
    if "slurm" in raw:
        kw["slurm"] = _mapping("slurm", raw["slurm"])
    if "lr_schedule" in raw:
        kw["lr_schedule"] = _mapping("lr_schedule", raw["lr_schedule"])
    if "weights" in raw:
        kw["weights"] = tuple(
            {} if w is None or w == "none" else _mapping("weights", w)
            for w in _as_list("weights", raw["weights"])
        )
    return Scenario(**kw)


def _as_list(key: str, value: Any) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise UserError(f"{key} is an empty list; give at least one value")
    return items


def _typed(key: str, value: Any, typ: type) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is bool and isinstance(value, bool):
        return value
    if isinstance(value, bool) or not isinstance(value, typ):
        raise UserError(f"{key} must be {typ.__name__}, got {value!r} ({_kind(value)})")
    return value


def _named(key: str, c: Any) -> dict[str, Any]:
    """A registry entry: a bare name or a mapping with ``name`` and parameters."""
    if isinstance(c, str):
        return {"name": c}
    if not isinstance(c, dict):
        raise UserError(f"{key} entry {c!r} must be a name or a mapping like {{name: ...}}")
    return dict(c)


_MAPPING_EXAMPLES = {
    "slurm": "{partition: gpu}", "lr_schedule": "{milestones: [30, 45], gamma: 0.1}",
    "weights": "[none, {bits: 8}]",
}  # fmt: skip


def _mapping(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UserError(
            f"{key} entry {value!r} must be a mapping; e.g. `{key}: [{{backend: mpi}}]`"
            if key in ("include", "exclude")
            else f"{key} must be a mapping, got {_show(value)}; "
            f"e.g. `{key}: {_MAPPING_EXAMPLES[key]}`"
        )
    return {str(k): v for k, v in value.items()}


def _batch(b: Any) -> int | dict[int, int]:
    if isinstance(b, dict):
        return {
            _typed("batch_size key", k, int): _typed("batch_size", v, int) for k, v in b.items()
        }
    return int(_typed("batch_size", b, int))


def _kind(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _close_match(word: str, valid: list[str]) -> str:
    import difflib

    m = difflib.get_close_matches(word, valid, n=1)
    return f" (did you mean {m[0]!r}?)" if m else ""


# -- value checks --------------------------------------------------------------------------------
def _check_name(name: str) -> None:
    if not name or any(c in name for c in "/\\ \t") or name.startswith("."):
        raise UserError(f"name {name!r} must be a plain directory name; e.g. `name: smoke`")


def _check_choices(key: str, values: tuple[str, ...], valid: tuple[str, ...]) -> None:
    for v in values:
        if v not in valid:
            raise UserError(
                f"{key} {v!r} is not one of {', '.join(valid)}; e.g. `{key}: {valid[0]}`"
            )


def _show(v: Any, limit: int = 40) -> str:
    """repr() for error messages, short even for a 5000-digit integer."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:
        return f"{'-' if v < 0 else ''}an integer of {v.bit_length()} bits"
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_positive(key: str, values: tuple[int, ...], example: str, hi: int = 1 << 20) -> None:
    for v in values:
        if v < 1:
            raise UserError(f"{key} must be >= 1, got {_show(v)}; e.g. `{example}`")
        if v > hi:
            raise UserError(f"{key} must be at most {hi}, got {_show(v)}; e.g. `{example}`")


def _check_range(key: str, v: float, lo: float, hi: float, example: str = "") -> None:
    if not lo <= v <= hi:
        fix = f"; e.g. `{example}`" if example else ""
        raise UserError(f"{key} must be in [{lo:g}, {hi:g}], got {_show(v)}{fix}")


def _check_accuracy_mode(sc: Scenario) -> None:
    for skew in sc.skew:
        _check_range("skew", skew, 0.0, 1.0, example="skew: [0, 0.8]")
    _check_range("weight_decay", sc.weight_decay, 0.0, 1e3, example="weight_decay: 0.0001")
    if sc.target_accuracy is not None:
        _check_range(
            "target_accuracy", sc.target_accuracy, 0.0, 1.0, example="target_accuracy: 0.8"
        )
    _check_lr_schedule(sc.lr_schedule)
    if sc.epochs is None:
        return
    _check_range("epochs", sc.epochs, 1, 10**5, example="epochs: 10")
    if "synthetic" in sc.dataset:
        raise UserError(
            "epochs needs a dataset with a train/test split, got dataset synthetic; e.g. "
            "`dataset: digits` (bundled) or `dataset: fashion-mnist` (make data)"
        )


def _check_weights(weights: dict[str, Any]) -> None:
    for k in weights:
        if k != "bits":
            raise UserError(
                f"weights: unknown key {_show(k)}; valid: bits; e.g. `weights: [none, {{bits: 8}}]`"
            )
    bits = weights.get("bits", 32)
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 32:
        raise UserError(
            f"weights.bits must be a whole number in [2, 32], got {_show(bits)}; "
            "e.g. `weights: {bits: 8}`"
        )


def _check_lr_schedule(sched: dict[str, Any]) -> None:
    ex = "e.g. `lr_schedule: {milestones: [30, 45], gamma: 0.1}`"
    for k in sched:
        if k not in LR_SCHEDULE_KEYS:
            raise UserError(
                f"lr_schedule: unknown key {_show(k)}; valid: {', '.join(LR_SCHEDULE_KEYS)}; {ex}"
            )
    if "milestones" in sched and "every" in sched:
        raise UserError(f"lr_schedule takes milestones or every, not both; {ex}")
    gamma = sched.get("gamma", 0.1)
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0 < gamma <= 1:
        raise UserError(f"lr_schedule.gamma must be in (0, 1], got {_show(gamma)}; {ex}")
    ms = sched.get("milestones", [])
    if not isinstance(ms, list) or not all(
        isinstance(m, int) and not isinstance(m, bool) and 1 <= m <= 10**5 for m in ms
    ):
        raise UserError(
            f"lr_schedule.milestones must be a list of epochs >= 1, got {_show(ms)}; {ex}"
        )
    every = sched.get("every", 1)
    if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= 10**5:
        raise UserError(
            f"lr_schedule.every must be a whole number of epochs >= 1, got {_show(every)}; {ex}"
        )


def _check_filter(key: str, entry: dict[str, Any]) -> None:
    if not entry:
        raise UserError(
            f"{key} has an empty entry; give axes to match, e.g. `{key}: [{{backend: mpi}}]`"
        )
    for k in entry:
        if k not in FILTER_KEYS:
            hint = _close_match(k, list(FILTER_KEYS))
            raise UserError(
                f"{key} entry matches on unknown axis {k!r}{hint}; valid: {', '.join(FILTER_KEYS)}"
            )


def _check_batch(batch: int | dict[int, int], world_sizes: tuple[int, ...]) -> None:
    sizes = batch.values() if isinstance(batch, dict) else [batch]
    for b in sizes:
        if b < 1:
            raise UserError(f"batch_size must be >= 1, got {b}; e.g. `batch_size: 32`")
    if isinstance(batch, dict):
        missing = [w for w in world_sizes if w not in batch]
        if missing:
            raise UserError(
                f"batch_size map has no entry for world_size {missing[0]}; "
                f"add `{missing[0]}: <per-rank batch>` or give one number"
            )
