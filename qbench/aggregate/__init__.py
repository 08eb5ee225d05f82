"""Aggregation schemes by name (one file each)."""

from __future__ import annotations

from typing import Any

from qbench.aggregate.allgather import AllGather
from qbench.aggregate.allreduce import AllReduce
from qbench.aggregate.async_ps import AsyncPS
from qbench.aggregate.base import Aggregator, split_ranges
from qbench.aggregate.gossip import Gossip
from qbench.aggregate.integer_allreduce import IntegerAllReduce
from qbench.aggregate.parameter_server import ParameterServer
from qbench.aggregate.push_sum import PushSum
from qbench.aggregate.reduce_broadcast import ReduceBroadcast
from qbench.aggregate.simulated_lowprec import SimulatedLowPrec
from qbench.comm import Comm
from qbench.compress import Compressor
from qbench.ddp import options as ddp_options
from qbench.errors import choice_error

SCHEMES: dict[str, type[Aggregator]] = {
    s.name: s
    for s in (
        AllReduce,
        ReduceBroadcast,
        Gossip,
        AllGather,
        SimulatedLowPrec,
        IntegerAllReduce,
        ParameterServer,
        PushSum,
        AsyncPS,
    )
}

__all__ = ["SCHEMES", "Aggregator", "build", "check_params", "split_ranges"]


def check_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Validate a scheme's name and parameters (UserError naming the bad one); the DDP options
    (``backward``, ``bucket_cap_mb``, ...) are checked by qbench.ddp.options and kept."""
    if name == ddp_options.DDP:
        return ddp_options.check_ddp(params)
    if not isinstance(name, str) or name not in SCHEMES:  # a YAML list or mapping, too
        raise choice_error("scheme", name, ["auto", ddp_options.DDP, *SCHEMES])
    backward, own = ddp_options.split(name, params)
    return {**SCHEMES[name].check_params(own), **backward}


def build(
    name: str,
    comm: Comm,
    compressor: Compressor,
    numel: int,
    offset: int = 0,
    params: dict[str, Any] | None = None,
) -> Aggregator:
    _, own = ddp_options.split(name, params or {})  # DDP options belong to the DDP loop
    kwargs = SCHEMES[name].check_params(own)
    return SCHEMES[name](comm, compressor, numel, offset, **kwargs)
