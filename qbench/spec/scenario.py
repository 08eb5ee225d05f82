"""Scenario YAML -> frozen, validated dataclasses. Every bad key or value is rejected here.

Scalars or lists are accepted for every sweep axis; a list means "sweep over these".
Errors are :class:`qbench.errors.UserError` with one line naming the key, the value and a fix.

Why one module: the Scenario dataclass, its defaults and the parser that checks and fills each
field are one schema; apart, a key's type and its check drift.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from qbench import catalog
from qbench.catalog import specs, workloads
from qbench.errors import UserError, did_you_mean, type_name
from qbench.spec import checks, layers, network, parts
from qbench.spec.checks import FILTER_KEYS, LR_SCHEDULE_KEYS  # noqa: F401  # the schema's

# The closed sets a run holds are its parts' Literal types (qbench.spec.parts); read from there.
BACKENDS = parts.BACKENDS
LAUNCHERS = ("local", "slurm")
ISOLATIONS = ("auto", "group", "process")  # auto: group locally, process under Slurm
DEVICES = ("auto", "cpu", "cuda")
COMPUTE = (*parts.PRECISIONS, parts.REPLAY)
REPLAY = parts.REPLAY  # fp32 compute replayed from a measured timeline (qbench.run.replay)
NORMS = parts.NORMS
ROUNDING = parts.ROUNDINGS  # qbench.run.rounding
ROUNDED_COMPUTE = ("int8", "int8-asym")  # compute that rounds stochastically (precision.INT8)
NONFINITE = parts.NONFINITE
"""What a step whose gradient holds a NaN or inf does (qbench.run.nonfinite reads it here)."""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A sweep: the cross-product of its list-valued axes (see README, "Scenario schema")."""

    name: str
    """Sweep name; results go to ``results/<name>/`` unless ``--out`` is given."""
    model: tuple[dict[str, Any], ...]
    """Workloads, each a registry name (``qbench models`` lists them),
    ``{name: synthetic, params: 25M, gflops: 1}`` with model parameters, or the user's own
    ``{factory: "mypkg.nets:build", params: {...}, input_shape: [3, 32, 32], num_classes: 10}``
    (``qbench.catalog.workloads``)."""
    dataset: tuple[str | dict[str, Any], ...] = ("synthetic",)
    """Input data; ``synthetic`` makes random inputs of the model's shape; a real dataset by
    name, or ``{factory: "mypkg.data:splits"}`` returning a torch Dataset."""
    world_size: tuple[int, ...] = (1, 2)
    """Numbers of ranks (processes) in all; CPU ranks get one thread each."""
    nodes: tuple[int, ...] = (1,)
    """Hosts the ranks are spread over (world_size / nodes each) under ``launcher: slurm``;
    on one machine, emulated hosts are a network entry's ``nodes`` (``network: {nodes: 2}``)."""
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
    steps_per_epoch: int | None = None
    """Accuracy mode: at most this many steps per epoch (each epoch then trains on a part of
    the split, in its usual random order); none = the whole split. ``qbench sweep --quick``
    sets it to check scenarios end to end at a tiny scale."""
    cover: bool = False
    """Run a covering subset of the matrix only: every value of every axis (and every scheme
    with each of its compressors) in at least one run; ``qbench sweep --quick`` sets it, so that
    a smoke test of a scenario costs a few runs, not its cross product."""
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
    channels (qbench.run.precision)."""
    weights: tuple[dict[str, Any], ...] = ({},)
    """Axis: ``{bits: N}`` quantizes every parameter to N-bit fixed point after each step
    (seed 000 section 5.4); ``none`` (``{}``) leaves the model in fp32."""
    rounding: str = "per-rank"
    """Where the stochastic rounding of int8 compute and ``weights`` draws from: ``per-rank``,
    each rank its own draws; ``shared``, every rank the same draws, as seed 001's authors' code
    (qbench.run.rounding). Applies to the runs that round stochastically only."""
    lr: float = 0.05
    """SGD learning rate."""
    momentum: float = 0.9
    """SGD momentum."""
    optimizer: dict[str, Any] = field(default_factory=dict)
    """The optimizer with every parameter resolved (``qbench.catalog.workloads``); ``{}``: SGD
    with the ``lr``, ``momentum`` and ``weight_decay`` above. One per scenario: reports compare
    runs of one optimizer."""
    loss: dict[str, Any] = field(default_factory=dict)
    """The loss (``qbench.catalog.workloads.loss``); ``{}``: cross entropy."""
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
    isolation: str = "auto"
    """``group``: the runs of each rank group (same backend, world size, nodes, link, device)
    run in turn in one launch, each exactly as if alone (docs/isolation.md); ``process``: one
    launch per run; ``auto``: group with the local launcher, process under Slurm (a job per
    run). ``--isolation`` overrides; not part of run ids."""
    slurm: dict[str, Any] = field(default_factory=dict)
    """Slurm options (partition, time, account, mode, array, ...; see docs/launchers.md)."""
    timeout: float = 600.0
    """Seconds a run may take before its processes are killed and it is marked timeout."""
    telemetry: bool = False
    """Record per-layer quantization error, residual norm and bits per value (slower)."""
    profile: bool = False
    """Write a torch.profiler Chrome trace per rank of a few measured iterations, phases as
    named ranges (slower: reports keep these runs out of speed summaries)."""
    layers: layers.LayerPolicy = field(default_factory=layers.LayerPolicy)
    """Which tensors travel in full precision, and per-layer compressor overrides."""
    nonfinite: str = "fail"
    """A NaN or inf in a rank's gradient: ``fail`` the run, naming the iteration and tensor, or
    ``skip`` the step on every rank (counted in the records, as a loss scaler would)."""
    dilation: float = 1.0
    """Time dilation (``compute: replay`` only): the emulated links run D times slower than the
    rates they stand for, replayed compute and the codecs' time stretch D times, and reports
    divide measured times by D (qbench.run.replay)."""
    timeline: str = ""
    """A replay timeline to use instead of measuring one (``compute: replay`` only): a run's
    ``timeline.json``, e.g. from a replayed sweep on a GPU machine; its path, made absolute."""
    codec_time: str = ""
    """Replayed codec time (``compute: replay`` only): a ``qbench bench kernels --json`` file,
    e.g. measured on a GPU; each encode and decode of the flat loop lasts what that device took
    (times the dilation), while the payloads stay the real codec's. Its path, made absolute."""
    source: str = field(default="<embedded>", compare=False)
    """Where the scenario was read from (not part of any run's identity)."""

    def __post_init__(self) -> None:
        checks.check_name(self.name)
        checks.check_choices("backend", self.backend, BACKENDS)
        checks.check_choices("device", self.device, DEVICES)
        for m in self.model:
            if not isinstance(m.get("name"), str) and "factory" not in m:
                raise UserError(
                    f"model {m!r} has no name; e.g. `model: mlp` or "
                    "`- {name: synthetic, params: 25M}`"
                )
        for s in self.scheme:
            if "name" not in s:
                raise UserError(f"scheme {s!r} has no name; e.g. `- {{name: reduce-broadcast}}`")
        for net in self.network:
            network.check(net)
        if any("nodes" in net for net in self.network) and self.nodes != (1,):
            raise UserError(
                f"nodes: {list(self.nodes)} and network entries with nodes say the same thing "
                "twice; keep one, e.g. `network: [{nodes: 2, inter: 1gbit}]` without `nodes:`"
            )
        checks.check_positive("world_size", self.world_size, example="world_size: [1, 2, 4]")
        checks.check_positive("nodes", self.nodes, example="nodes: [1, 2]")
        if self.gpus_per_node is not None:
            checks.check_range(
                "gpus_per_node", self.gpus_per_node, 1, 1024, example="gpus_per_node: 8"
            )
        checks.check_range("repeats", self.repeats, 1, 1000, example="repeats: 3")
        if self.price_per_hour is not None:
            checks.check_range(
                "price_per_hour", self.price_per_hour, 0.0, 1e6, example="price_per_hour: 32.77"
            )
        check_launcher(self.launcher)
        check_isolation(self.isolation)
        for key, entries in (("include", self.include), ("exclude", self.exclude)):
            for entry in entries:
                checks.check_filter(key, entry)
        checks.check_batch(self.batch_size, self.world_size)
        for seed in self.seed:
            checks.check_range("seed", seed, 0, 2**32 - 1, example="seed: [0, 1, 2]")
        checks.check_range("warmup", self.warmup, 0, 10**6)
        checks.check_range("iterations", self.iterations, 1, 10**7)
        checks.check_accuracy_mode(
            skew=self.skew, weight_decay=self.weight_decay, target_accuracy=self.target_accuracy,
            lr_schedule=self.lr_schedule, epochs=self.epochs, dataset=self.dataset,
        )  # fmt: skip
        if self.steps_per_epoch is not None:
            checks.check_range("steps_per_epoch", self.steps_per_epoch, 1, 10**7)
            if not self.epochs:
                raise UserError(
                    "steps_per_epoch applies to accuracy mode only; set `epochs:` too, or "
                    "use `iterations:` in iteration mode"
                )
        checks.check_choices("compute", self.compute, COMPUTE)
        checks.check_range("dilation", self.dilation, 1.0, 1e4, example="dilation: 10")
        if self.dilation != 1 and set(self.compute) != {REPLAY}:
            raise UserError(
                f"dilation: {self.dilation:g} slows the links and stretches replayed compute; "
                "real compute cannot slow down with them: use `compute: replay` (alone), or "
                "drop `dilation:`"
            )
        if self.timeline:
            checks.check_timeline(self.timeline, replayed=REPLAY in self.compute)
        if self.codec_time:
            checks.check_codec_time(self.codec_time, replayed=REPLAY in self.compute)
        if REPLAY in self.compute and self.epochs:
            raise UserError(
                "compute: replay stands in for the model's work, so it learns nothing: accuracy "
                "mode (`epochs:`) cannot use it; drop `replay` from compute, or use "
                "`iterations:`"
            )
        checks.check_choices("norm", (self.norm,), NORMS)
        checks.check_choices("nonfinite", (self.nonfinite,), NONFINITE)
        for w in self.weights:
            checks.check_weights(w)
        checks.check_choices("rounding", (self.rounding,), ROUNDING)
        if self.rounding != "per-rank" and not (
            set(self.compute) & set(ROUNDED_COMPUTE) or any(self.weights)
        ):
            raise UserError(
                f"rounding: {self.rounding} applies to stochastic rounding, which only compute "
                f"{' or '.join(ROUNDED_COMPUTE)} and `weights: {{bits: N}}` do; add one of "
                "them or drop `rounding:`"
            )
        checks.check_range("lr", self.lr, 0.0, 1e3, example="lr: 0.05")
        checks.check_range("momentum", self.momentum, 0.0, 1.0, example="momentum: 0.9")
        checks.check_range("timeout", self.timeout, 1.0, 1e7, example="timeout: 600")
        for c in self.compressor:
            if "name" not in c:
                raise UserError(f"compressor {c!r} has no name; e.g. `- {{name: qsgd, bits: 4}}`")

    def batch_for(self, world_size: int) -> int:
        if isinstance(self.batch_size, int):
            return self.batch_size
        return self.batch_size[world_size]


# -- loading -------------------------------------------------------------------------------------
_AXES = {
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
    "isolation": str,
    "warmup": int,
    "iterations": int,
    "epochs": int,
    "steps_per_epoch": int,
    "weight_decay": float,
    "target_accuracy": float,
    "norm": str,
    "rounding": str,
    "lr": float,
    "momentum": float,
    "timeout": float,
    "telemetry": bool,
    "profile": bool,
    "cover": bool,
    "nonfinite": str,
    "dilation": float,
    "timeline": str,
    "codec_time": str,
}


def check_launcher(value: str) -> None:
    """``launcher:``, and ``--launcher`` / ``launcher=`` that override it."""
    checks.check_choices("launcher", (value,), LAUNCHERS)


def check_isolation(value: str) -> None:
    """``isolation:``, and ``--isolation`` / ``isolation=`` that override it."""
    checks.check_choices("isolation", (value,), ISOLATIONS)


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    return loads(read_text(path), source=str(path))


def read_text(path: str | Path) -> str:
    """A scenario file's text, or one UserError line saying why it cannot be one: missing, a
    directory or other non-file, unreadable, binary or not UTF-8."""
    p, name = Path(path), repr(str(path))
    if p.is_symlink() and not p.exists():
        raise UserError(f"scenario file {name} is a broken symbolic link; check the path")
    if p.is_dir():
        raise UserError(f"scenario file {name} is a directory; give its YAML file, e.g. "
                        "scenarios/tour.yaml")  # fmt: skip
    if not p.exists():
        raise UserError(f"scenario file {name} not found; check the path (e.g. scenarios/)")
    if not p.is_file():
        raise UserError(f"scenario file {name} is not a regular file; give a YAML file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise UserError(f"scenario file {name} cannot be read ({e.strerror}); check its "
                        "permissions") from None  # fmt: skip
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"scenario file {name} is not UTF-8 text (byte {e.start}: {data[e.start]:#04x}); "
            "save it as UTF-8 YAML"
        ) from None


def loads(text: str, source: str = "<embedded>") -> Scenario:
    """Parse and validate scenario YAML text."""
    raw = _read_yaml(text, source)
    try:
        return parse(raw, source=source)
    except RecursionError:
        raise UserError(
            f"{source}: a value is nested too deeply; a scenario needs at most a few levels "
            "(e.g. `world_size: [1, 2]`)"
        ) from None


def _read_yaml(text: str, source: str) -> Any:
    """The YAML document in ``text``, or one UserError line saying why it cannot be read
    (what every reader of scenario text goes through: ``loads`` and ``--set``)."""
    try:
        return yaml.safe_load(text)
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


def _top_level(raw: Any, source: str) -> dict[Any, Any]:
    """``raw`` when it is a mapping of keys, as every scenario is; else one UserError line."""
    if not isinstance(raw, dict):
        raise UserError(
            f"{source}: a scenario must be a YAML mapping of keys, got {type_name(raw)}"
        )
    return raw


def with_overrides(text: str, source: str, sets: Sequence[str]) -> str:
    """Scenario text with top-level keys replaced, ``KEY=VALUE`` each (VALUE is YAML:
    ``seed=0``, ``world_size=[1,2,4,8]``, ``backend=nccl``), as ``qbench sweep --set`` gives
    them: the same scenario at another scale or on other hardware. The result is new YAML text
    (kept with the results as the scenario that ran); unknown keys fail later, in ``parse``."""
    if not sets:
        return text
    raw = _top_level(_read_yaml(text, source), source)
    valid = [f.name for f in fields(Scenario) if f.name != "source"]
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. --set seed=0")
        if key.strip() not in valid:  # the option's mistake, not the file's
            raise UserError(
                f"--set {item!r}: unknown key {key.strip()!r}"
                f"{did_you_mean(key.strip(), valid)}; valid keys: {', '.join(valid)}"
            )
        try:
            raw[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UserError(
                f"--set {item!r}: the value is not valid YAML; quote it, e.g. --set 'seed=[0, 1]'"
            ) from None
    _blame_sets(raw, source, sets)
    note = f"# {source} with --set {' '.join(sets)}\n"
    return note + yaml.safe_dump(raw, sort_keys=False)


def _blame_sets(raw: dict[Any, Any], source: str, sets: Sequence[str]) -> None:
    """A value --set gave that the scenario rejects is reported against --set."""
    try:
        parse(raw, source)
    except UserError as e:
        said = str(e).removeprefix(f"{source}: ")
        for item in sets:
            if re.match(rf"{re.escape(item.partition('=')[0].strip())}\b", said):
                raise UserError(f"--set {item!r}: {said}") from None


def _short(e: BaseException, limit: int = 80) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse(raw: Any, source: str = "<embedded>") -> Scenario:
    """Validate a parsed YAML mapping into a Scenario."""
    raw = _top_level(raw, source)
    valid = [f.name for f in fields(Scenario) if f.name != "source"]
    unknown = sorted(str(k) for k in raw if k not in valid)
    if unknown:
        hint = did_you_mean(unknown[0], valid)
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
            entries = enumerate(_as_list(key, raw[key]), 1)
            kw[key] = tuple(_entry(source, key, i, c) for i, c in entries)
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
    if "dataset" in raw:
        kw["dataset"] = tuple(_dataset(d) for d in _as_list("dataset", raw["dataset"]))
    if "optimizer" in raw:
        top = {k: raw[k] for k in workloads.TOP_LEVEL if k in raw}
        kw["optimizer"] = workloads.optimizer(raw["optimizer"], top)
    if "loss" in raw:
        kw["loss"] = workloads.loss(raw["loss"])
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
        raise UserError(
            f"{key} must be {typ.__name__}, got {checks.show(value)} ({type_name(value)})"
        )
    return value


def _entry(source: str, key: str, index: int, c: Any) -> dict[str, Any]:
    """A model, compressor or scheme entry; compressors and schemes are validated here, so a
    mistake names the file and the entry as written (the catalog suggests the nearest key)."""
    try:
        entry = _named(key, c)
        if key == "compressor":
            catalog.compressor(entry)
        elif key == "scheme" and entry.get("name") != "auto":
            catalog.scheme(entry)
    except UserError as e:
        raise UserError(f"{source}: {key} entry {index} `{_written(c)}`: {e}") from None
    return entry


def _written(value: Any) -> str:
    """An entry as YAML flow text (``{name: qsgd, bucket: 512}``), at most 60 characters."""
    if isinstance(value, str):  # the command line's form, as written
        text = value
    else:
        try:
            text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
        except yaml.YAMLError:
            text = repr(value)
        text = text.strip().removesuffix("...").strip()
    if "\n" in text or "\r" in text:  # a one-line error, whatever YAML held
        text = checks.show(value, 60)
    return text if len(text) <= 60 else text[:57] + "..."


def _dataset(d: Any) -> str | dict[str, Any]:
    """A dataset name, or ``{factory: ...}`` (checked by the matrix, like model factories)."""
    if isinstance(d, dict) and "factory" in d:
        return dict(d)
    return str(_typed("dataset", d, str))


def _named(key: str, c: Any) -> dict[str, Any]:
    """A registry entry: a bare name, the command line's ``qsgd:bits=4`` (compressors and
    schemes, as ``catalog.specs`` reads it) or a mapping with ``name`` and parameters."""
    if isinstance(c, str) and key != "model" and ":" in c:
        return specs.mapping(c, key)
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
            else f"{key} must be a mapping, got {checks.show(value)}; "
            f"e.g. `{key}: {_MAPPING_EXAMPLES[key]}`"
        )
    return {str(k): v for k, v in value.items()}


def _batch(b: Any) -> int | dict[int, int]:
    if isinstance(b, dict):
        return {
            _typed("batch_size key", k, int): _typed("batch_size", v, int) for k, v in b.items()
        }
    return int(_typed("batch_size", b, int))


# -- value checks --------------------------------------------------------------------------------
