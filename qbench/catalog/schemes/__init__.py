"""Every aggregation scheme once: parameters, label and capabilities (no torch).

Which backends, compressors and world sizes a scheme accepts, each with its one-line reason, is
in :mod:`qbench.spec.rules`. The aggregators in ``qbench.aggregate`` take their validated
parameters from here. To add a scheme: an entry here, its rules there, and an aggregator
module.

Why one module: every scheme's entry, with the parameters and names several entries share, is
the one place each of those facts lives; a reader finds any scheme by searching one file.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qbench.catalog.compressors import COMPRESSORS
from qbench.catalog.params import Param, at_least, fraction, validate
from qbench.catalog.registry import Registry
from qbench.catalog.schemes import traffic
from qbench.catalog.schemes.traffic import Declared

Params = dict[str, Any]
Check = Callable[[Params, Params], str | None]
"""(given parameters, validated parameters) -> a problem between them, or None."""


@dataclass(frozen=True)
class SchemeEntry:
    name: str
    summary: str
    seed: str
    aggregator: str
    """``module:Class`` of the aggregator (``qbench.aggregate``); "" for the schemes that are a
    training loop of their own: ddp (``qbench.run.loops.ddp``), fsdp (``qbench.run.loops.fsdp``)
    and the asynchronous ones
    (``qbench.run.async_ps``)."""
    params: tuple[Param, ...] = ()
    kind: str = "collective"
    """collective (every rank gets the mean), decentralized (each rank its own model),
    periodic (each rank its own model, an exchange every H steps: local SGD, DiLoCo),
    asynchronous (a server, no barrier), ddp (PyTorch's DDP loop) or fsdp (FSDP2's loop)."""
    reduces: bool = True
    """It computes the mean gradient (simulated-lowprec only moves the bytes)."""
    per_bucket: bool = False
    """Can run per DDP bucket during backward (``backward: true``)."""
    pipelined: bool = False
    """Takes ``overlap: C``: C chunks double-buffered (seed 002 §3.2.1)."""
    codec_calls: bool = True
    """Encodes and decodes through the compressor's ``encode`` / ``decode`` (what ``qbench
    bench kernels`` times, so ``codec_time:`` can replay it); integer-allreduce quantizes with
    kernels of its own."""
    replays: bool = True
    """Its loop can sleep through the model's work (``compute: replay``: the flat and DDP
    loops, ``qbench.run.replay.loops``); the asynchronous server's and FSDP's loops cannot."""
    cross_check: Check = lambda given, p: None
    traffic: Declared | None = None
    """What it sends and codes per aggregation (``qbench.catalog.schemes.traffic``), which the cost
    model times; None: a scheme the cost model cannot time."""
    display: Callable[[Params], str] | None = None
    """Its name for people in figures, tables and pages ("Choco-SGD, ring"), from the
    validated parameters (a ``down`` compressor as its display name); None: the name."""


# -- shared parameters --------------------------------------------------------------------------
DEFAULT_BUCKET_CAP_MB = 25.0  # torch.nn.parallel.DistributedDataParallel's default
DDP_OPTIONS = (
    Param("bucket_cap_mb", DEFAULT_BUCKET_CAP_MB, "DDP bucket size in MB (torch's default 25)",
          float, "a size in MB > 0", lambda v: 0 < v <= 1e5),
    Param("gradient_as_bucket_view", False, "gradients as views into DDP's buckets", bool),
)  # fmt: skip
BACKWARD = Param("backward", False, "run per DDP bucket during backward instead of after it", bool)
OVERLAP = Param(
    "overlap", 1, "chunks double-buffered so encode, comm and decode overlap", int,
    "a chunk count >= 1", at_least(1), example=4,
)  # fmt: skip
GAMMA = Param("gamma", 1.0, "consensus step size of choco / deepsqueeze", float, "a number in "
              "(0, 1]", fraction, example=0.5)  # fmt: skip
DOWN = Param(
    "down", None, "compressor of what the server sends back (double quantization); none: "
    "fp32", (dict, str, type(None)), "a compressor spec with a name",
    lambda v: v is None or isinstance(v, str) or "name" in v, example="{name: qsgd, bits: 8}",
)  # fmt: skip


CODEC_PARAMS = ("down", "all_gather")
"""Scheme parameters that are compressor specs of their own (validated as compressors, shown
by their brief names, labelled by their labels)."""


def _summable(name: object) -> bool:
    """A compressor whose payload can be summed as values (the ``summable`` capability)."""
    return isinstance(name, str) and name in COMPRESSORS and COMPRESSORS[name].summable


INTRA = Param(
    "intra", "none", "codec of the sum inside a node: none (fp32) or a summable 16-bit cast",
    str, "a summable compressor: " + ", ".join(n for n in COMPRESSORS if _summable(n)),
    _summable, example="bf16",
)  # fmt: skip
INTER = Param(
    "inter", "reduce-scatter", "exchange between nodes: reduce-scatter (every local rank "
    "carries 1/G), or reduce-broadcast / allgather among node leaders", str,
    choices=("reduce-scatter", "reduce-broadcast", "allgather"),
)  # fmt: skip


def _hierarchical_name(p: Params) -> str:
    inside = "fp32" if p["intra"] == "none" else p["intra"]
    return ", ".join(
        [f"hierarchical ({inside} inside, {p['inter']} between)", *_details(p)]
        + (["per DDP bucket"] if p.get("backward") else [])
    )


def _ddp_options_need_backward(given: Params, p: Params) -> str | None:
    if not p.get("backward") and any(o.name in given for o in DDP_OPTIONS):
        return "bucket_cap_mb and gradient_as_bucket_view need `backward: true`"
    return None


def _gamma_only_for(algorithm: str, other: str) -> Check:
    def check(given: Params, p: Params) -> str | None:
        if "gamma" in given and p["algorithm"] == algorithm:
            return (
                f"gamma is the consensus step size of {other}; {algorithm} mixes directly: "
                f"drop `gamma` or use `algorithm: choco`"
            )
        return None

    return check


def qgm_beta(value: object) -> float:
    """push-sum's ``qgm``: false (off), true (beta 0.9, Lin et al. 2021) or beta in [0, 1)."""
    if isinstance(value, bool):
        return 0.9 if value else 0.0
    return float(value)  # type: ignore[arg-type]  # validated: a number in [0, 1)


def torus_rows(size: int) -> int:
    """Rows of the squarest r x c torus of ``size`` ranks (2 <= r <= c); 0 when there is none."""
    return next((r for r in range(math.isqrt(size), 1, -1) if size % r == 0), 0)


# -- display names ------------------------------------------------------------------------------
_GOSSIP = {"dpsgd": "D-PSGD", "choco": "Choco-SGD", "deepsqueeze": "DeepSqueeze"}
_GRAPHS = {"directed-ring": "directed ring", "exponential": "exponential graph"}
_ASYNC = {"asylpg": "AsyLPG", "sparse": "Sparse-AsyLPG", "accelerated": "Acc-AsyLPG"}


def _details(p: Params) -> list[str]:
    """What the shared parameters add to a name: pipelining, DDP bucket size, gamma, down."""
    out = [f"{p['overlap']} chunks pipelined"] if p.get("overlap", 1) > 1 else []
    if p.get("bucket_cap_mb", DEFAULT_BUCKET_CAP_MB) != DEFAULT_BUCKET_CAP_MB:
        out.append(f"buckets {p['bucket_cap_mb']:g} MB")
    if p.get("gradient_as_bucket_view"):
        out.append("gradients as bucket views")
    if p.get("gamma", 1.0) != 1.0:
        out.append(f"gamma {p['gamma']:g}")
    if p.get("down"):
        out.append(f"{p['down']} down")
    return out


def _flat(title: str) -> Callable[[Params], str]:
    """allreduce, reduce-broadcast, ...: "per DDP bucket" when run during backward."""
    return lambda p: ", ".join(
        [title + (" per DDP bucket" if p.get("backward") else ""), *_details(p)]
    )


def _gossip_name(p: Params) -> str:
    return ", ".join([_GOSSIP[p["algorithm"]], p["topology"], *_details(p)])


def _push_sum_name(p: Params) -> str:
    beta = qgm_beta(p["qgm"])
    name = "push-sum" + (f" + QGM{'' if beta == 0.9 else f' {beta:g}'}" if beta else "")
    algorithm = {"sgp": ["SGP"], "choco": ["Choco"]}.get(p["algorithm"], [])
    return ", ".join([name, *algorithm, _GRAPHS[p["topology"]], *_details(p)])


def _async_name(p: Params) -> str:
    name = _ASYNC[p["variant"]] if p["down"] or p["variant"] != "asylpg" else "async PS"
    ratio = [f"{p['ratio'] * 100:g} % kept"] if p["variant"] == "sparse" else []
    return ", ".join([name, f"staleness {p['staleness']}", *ratio, *_details(p)])


# -- entries ------------------------------------------------------------------------------------
ALLREDUCE = SchemeEntry(
    "allreduce", "one sum allreduce (fp32, or fp16/bf16 casts), then / K", "002 (NCCL)",
    "qbench.aggregate.allreduce:AllReduce", params=(BACKWARD, *DDP_OPTIONS), per_bucket=True,
    cross_check=_ddp_options_need_backward, display=_flat("allreduce"),
    traffic=traffic.allreduce,
)  # fmt: skip
REDUCE_BROADCAST = SchemeEntry(
    "reduce-broadcast", "owners reduce a range each, re-encode the mean and send it to all",
    "002 §2.4.1", "qbench.aggregate.reduce_broadcast:ReduceBroadcast",
    params=(OVERLAP, BACKWARD, *DDP_OPTIONS), per_bucket=True, pipelined=True,
    cross_check=_ddp_options_need_backward, display=_flat("reduce-broadcast"),
    traffic=traffic.reduce_broadcast,
)  # fmt: skip
ALLGATHER = SchemeEntry(
    "allgather", "every rank sends its payload to all and decodes all K", "002 Alg. 1",
    "qbench.aggregate.allgather:AllGather", params=(BACKWARD, *DDP_OPTIONS), per_bucket=True,
    cross_check=_ddp_options_need_backward, display=_flat("allgather"),
    traffic=traffic.allgather,
)  # fmt: skip
SIMULATED_LOWPREC = SchemeEntry(
    "simulated-lowprec", "SIMULATED: an fp32-typed allreduce as large as the payload; "
    "gradients are not reduced (speed only)", "002 §4.4",
    "qbench.aggregate.simulated_lowprec:SimulatedLowPrec", reduces=False,
    display=lambda p: "simulated low precision", traffic=traffic.simulated_lowprec,
)  # fmt: skip
INTEGER_ALLREDUCE = SchemeEntry(
    "integer-allreduce", "shared bucket scales, qsgd levels summed as integers in one "
    "allreduce", "beyond the papers", "qbench.aggregate.integer_allreduce:IntegerAllReduce",
    params=(OVERLAP, BACKWARD, *DDP_OPTIONS), per_bucket=True, pipelined=True,
    codec_calls=False, cross_check=_ddp_options_need_backward,
    display=_flat("integer allreduce"), traffic=traffic.integer_allreduce,
)  # fmt: skip
PARAMETER_SERVER = SchemeEntry(
    "parameter-server", "rank 0 averages the encoded gradients and sends the mean back",
    "003, 000", "qbench.aggregate.parameter_server:ParameterServer", params=(DOWN,),
    display=lambda p: ", ".join(["parameter server", *_details(p)]),
)  # fmt: skip
GOSSIP = SchemeEntry(
    "gossip", "decentralized: each rank steps its model, then mixes with its neighbours",
    "000, 001", "qbench.aggregate.gossip:Gossip", kind="decentralized",
    params=(
        Param("topology", "ring", "undirected graph", str, choices=("ring", "torus")),
        Param("algorithm", "choco", "D-PSGD, Choco-SGD or DeepSqueeze", str,
              choices=("dpsgd", "choco", "deepsqueeze")),
        GAMMA,
    ),
    cross_check=_gamma_only_for("dpsgd", "choco and deepsqueeze"), display=_gossip_name,
)  # fmt: skip
PUSH_SUM = SchemeEntry(
    "push-sum", "decentralized over directed graphs (stochastic gradient push)", "001",
    "qbench.aggregate.push_sum:PushSum", kind="decentralized",
    params=(
        Param("topology", "directed-ring", "directed graph; exponential is time-varying", str,
              choices=("directed-ring", "exponential")),
        Param("algorithm", "auto", "sgp (exact), choco (Quant-SGP) or auto", str,
              choices=("auto", "sgp", "choco")),
        GAMMA,
        Param("qgm", False, "quasi-global momentum: true (beta 0.9) or beta in [0, 1)",
              (bool, float), "true, false or a momentum in [0, 1)",
              lambda v: isinstance(v, bool) or 0 <= v < 1),
    ),
    cross_check=_gamma_only_for("sgp", "choco"), display=_push_sum_name,
)  # fmt: skip
ASYNC_PS = SchemeEntry(
    "async-ps", "asynchronous parameter server with double quantization (AsyLPG)", "003",
    "", kind="asynchronous", replays=False,
    params=(
        Param("staleness", 4, "the most server updates a gradient may miss", int,
              "an integer >= 0 (0 = serial SGD)", at_least(0)),
        Param("variant", "asylpg", "asylpg, sparse (top-k first) or accelerated (Nesterov)",
              str, choices=("asylpg", "sparse", "accelerated")),
        DOWN,
        Param("ratio", 0.1, "variant sparse: fraction of each tensor's values kept", float,
              "in (0, 1]", fraction),
    ),
    cross_check=lambda given, p: (
        f"ratio applies to variant sparse only, got variant {p['variant']}; remove `ratio` or "
        "set `variant: sparse`" if "ratio" in given and p["variant"] != "sparse" else None
    ),
    display=_async_name,
)  # fmt: skip
HIERARCHICAL = SchemeEntry(
    "hierarchical", "sum inside each node (intra codec), exchange between nodes with the "
    "compressor, share inside the node", "NCCL, CGX", "qbench.aggregate.hierarchical:Hierarchical",
    params=(INTRA, INTER, BACKWARD, *DDP_OPTIONS), per_bucket=True,
    cross_check=_ddp_options_need_backward, display=_hierarchical_name,
    traffic=traffic.hierarchical,
)  # fmt: skip
DDP = SchemeEntry(
    "ddp", "PyTorch DistributedDataParallel: buckets allreduced during backward, torch's own "
    "hooks (fp16, bf16, PowerSGD)", "Agarwal et al. 2022 (baseline)", "", kind="ddp",
    params=DDP_OPTIONS, display=lambda p: ", ".join(["DDP", *_details(p)]),
)  # fmt: skip


def _fsdp_name(p: Params) -> str:
    out = ["FSDP"]
    if p["param_dtype"] != "fp32":
        out.append(f"{p['param_dtype']} parameters")
    if not p["reshard_after_forward"]:
        out.append("kept after forward (ZeRO-2)")
    if p["prefetch"] > 1:
        out.append(f"prefetch {p['prefetch']}")
    if p["all_gather"]:
        out.append(f"all-gather {p['all_gather']}")
    return ", ".join(out)


def _stateless_gather(given: Params, p: Params) -> str | None:
    spec = p["all_gather"]
    name = spec if isinstance(spec, str) else (spec or {}).get("name")
    if name is None:
        return None
    entry = COMPRESSORS.get(name)
    if entry is None or entry.hook_only:
        return f"all_gather: {name!r} is not a qbench codec; e.g. `{{name: qsgd, bits: 8}}`"
    given_params = {} if isinstance(spec, str) else {k: v for k, v in spec.items() if k != "name"}
    if entry.stateful or entry.error_feedback(validate(name, entry.params, given_params)):
        return (
            f"all_gather: {name} keeps error-feedback state, but the parameters it would carry "
            "over are overwritten by every step; use a stateless codec such as qsgd"
        )
    return None


FSDP_TORCH = ("none", "fp16", "bf16")
"""Compressors FSDP runs with torch's own reduce-scatter, in that reduce dtype (the 16-bit
baselines); every other codec goes through qbench's compressed reduce-scatter."""
FSDP = SchemeEntry(
    "fsdp", "PyTorch FSDP2 (fully_shard per block): gradients reduce-scattered, parameters "
    "all-gathered, both overlapped; qbench codecs as compressed reduce-scatter / all-gather",
    "Zhao et al. 2023 (baseline); ZeRO++ (qgZ, qwZ)", "", kind="fsdp", replays=False,
    params=(
        Param("reshard_after_forward", True, "free each block's gathered parameters after "
              "forward and gather them again in backward (ZeRO-3); false keeps them (ZeRO-2)",
              bool),
        Param("param_dtype", "fp32", "mixed precision: dtype of the gathered parameters and "
              "of forward and backward (MixedPrecisionPolicy.param_dtype)", str,
              choices=("fp32", "bf16", "fp16")),
        Param("prefetch", 1, "blocks whose all-gather is issued ahead: 1 is torch's own "
              "prefetch of the next block, more are set explicitly", int, "an integer >= 1",
              at_least(1), example=2),
        Param("all_gather", None, "codec of the parameter all-gather (ZeRO++ qwZ): each rank "
              "encodes its shard, all decode every shard; none: the param dtype",
              (dict, str, type(None)), "a compressor spec with a name",
              lambda v: v is None or isinstance(v, str) or "name" in v,
              example="{name: qsgd, bits: 8, bucket_size: 256}"),
    ),
    cross_check=_stateless_gather, display=_fsdp_name,
)  # fmt: skip

# -- exchange every H steps (issue 47) ----------------------------------------------------------
EVERY = Param("H", 50, "inner steps between outer exchanges", int, "an integer >= 1", at_least(1))
EXCHANGES = ("allreduce", "reduce-broadcast", "integer-allreduce", "hierarchical", "allgather")
"""The collective schemes an outer exchange can go through (each with its own rules)."""
EXCHANGE = Param(
    "exchange", "allreduce", "the collective scheme the outer gradients go through, with the "
    "scheme's compressor", str, choices=EXCHANGES,
)  # fmt: skip
WITHIN_NODE = Param(
    "within_node", "none", "none: every rank is a worker; allreduce: each node's ranks "
    "(LOCAL_WORLD_SIZE) are one data-parallel worker (gradients averaged over the node every "
    "step) and the node leaders run the outer exchange", str, choices=("none", "allreduce"),
)  # fmt: skip


def _periodic_check(given: Params, p: Params) -> str | None:
    if p["within_node"] == "allreduce" and p["exchange"] == "hierarchical":
        return (
            "within_node: allreduce already averages inside each node and exchanges among the "
            "node leaders; use a flat exchange (e.g. `exchange: reduce-broadcast`)"
        )
    return None


def _nesterov_needs_momentum(given: Params, p: Params) -> str | None:
    if given.get("nesterov") and p["outer_momentum"] == 0:
        return (
            "nesterov is a kind of momentum, and outer_momentum is 0 (torch.optim.SGD refuses "
            "the same); set `outer_momentum: 0.9` or drop `nesterov`"
        )
    return _periodic_check(given, p)


def _delay_below_h(given: Params, p: Params) -> str | None:
    if p["delay"] >= p["H"]:
        return (
            f"delay {p['delay']} must be below H {p['H']}: a fragment's merge must land "
            f"before its next exchange; e.g. `delay: {min(1, p['H'] - 1)}`"
        )
    return _nesterov_needs_momentum(given, p)


def _periodic_name(title: str) -> Callable[[Params], str]:
    def name(p: Params) -> str:
        out = [f"{title}, H {p['H']}"]
        if "fragments" in p:
            out.append(f"{p['fragments']} fragments, delay {p['delay']}, alpha {p['alpha']:g}")
        if "outer_lr" in p:
            nesterov = " Nesterov" if p["nesterov"] and p["outer_momentum"] else ""
            out.append(f"outer lr {p['outer_lr']:g}, momentum {p['outer_momentum']:g}{nesterov}")
        if p["exchange"] != "allreduce":
            out.append(f"via {p['exchange']}")
        if p["within_node"] == "allreduce":
            out.append("data parallel inside each node")
        return ", ".join(out)

    return name


OUTER = (
    Param("outer_lr", 0.7, "outer SGD learning rate (DiLoCo: 0.7)", float, "a number > 0",
          lambda v: v > 0),
    Param("outer_momentum", 0.9, "outer SGD momentum (DiLoCo: 0.9)", float,
          "a number in [0, 1)", lambda v: 0 <= v < 1),
    Param("nesterov", True, "Nesterov momentum in the outer step (DiLoCo: true)", bool),
)  # fmt: skip
LOCAL_SGD = SchemeEntry(
    "local-sgd", "each rank steps its own model; parameters averaged every H steps through the "
    "exchange", "Stich 2019; Lin et al. 2020 (beyond the seeds)",
    "qbench.aggregate.diloco:LocalSGD", kind="periodic", params=(EVERY, EXCHANGE, WITHIN_NODE),
    cross_check=_periodic_check, display=_periodic_name("local SGD"),
)  # fmt: skip
DILOCO = SchemeEntry(
    "diloco", "each rank steps its own model; every H steps the mean pseudo-gradient (global "
    "minus local) goes through the exchange and an outer SGD (Nesterov) steps the global model",
    "Douillard et al. 2023 (beyond the seeds)", "qbench.aggregate.diloco:DiLoCo",
    kind="periodic", params=(EVERY, *OUTER, EXCHANGE, WITHIN_NODE),
    cross_check=_nesterov_needs_momentum, display=_periodic_name("DiLoCo"),
)  # fmt: skip
STREAMING_DILOCO = SchemeEntry(
    "streaming-diloco", "DiLoCo on fragments of the model synced in turn, each every H steps "
    "at its own offset, merged `delay` steps later as alpha local + (1 - alpha) global",
    "Douillard et al. 2025 (beyond the seeds)", "qbench.aggregate.diloco:StreamingDiLoCo",
    kind="periodic",
    params=(
        EVERY,
        Param("fragments", 2, "runs of consecutive tensors synced in turn", int,
              "an integer >= 1", at_least(1)),
        Param("delay", 1, "inner steps between a fragment's exchange and its merge", int,
              "an integer >= 0", at_least(0)),
        Param("alpha", 0.5, "weight of the local value in the merge (0: take the global)",
              float, "a number in [0, 1]", lambda v: 0 <= v <= 1),
        *OUTER, EXCHANGE, WITHIN_NODE,
    ),
    cross_check=_delay_below_h, display=_periodic_name("Streaming DiLoCo"),
)  # fmt: skip

SCHEMES: Registry[SchemeEntry] = Registry({
    e.name: e
    for e in (ALLREDUCE, REDUCE_BROADCAST, GOSSIP, ALLGATHER, SIMULATED_LOWPREC, INTEGER_ALLREDUCE,
              PARAMETER_SERVER, PUSH_SUM, ASYNC_PS, HIERARCHICAL, DDP, FSDP, LOCAL_SGD, DILOCO,
              STREAMING_DILOCO)
})  # fmt: skip
"""Every scheme by name; plug-ins (``qbench.catalog.plugins``) join on first read."""
TORCH_HOOKS = ("none", "fp16", "bf16", "powersgd")
"""Compressors DDP runs with torch's own communication (``scheme: ddp``)."""
