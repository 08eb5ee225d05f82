"""Aggregation schemes (torch), one file each: turn K gradients into their mean."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qbench import catalog
from qbench.aggregate.allgather import AllGather
from qbench.aggregate.allreduce import AllReduce
from qbench.aggregate.base import Aggregator, split_ranges
from qbench.aggregate.diloco import DiLoCo, LocalSGD, StreamingDiLoCo
from qbench.aggregate.gossip import Gossip
from qbench.aggregate.hierarchical import Hierarchical
from qbench.aggregate.integer_allreduce import IntegerAllReduce
from qbench.aggregate.parameter_server import ParameterServer
from qbench.aggregate.push_sum import PushSum
from qbench.aggregate.reduce_broadcast import ReduceBroadcast
from qbench.aggregate.simulated_lowprec import SimulatedLowPrec
from qbench.catalog import importpath
from qbench.catalog.schemes import BACKWARD, DDP_OPTIONS, EXCHANGE
from qbench.comm.base import Comm
from qbench.compress import Compressor
from qbench.errors import UserError

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
        Hierarchical,
        LocalSGD,
        DiLoCo,
        StreamingDiLoCo,
    )
}

__all__ = ["SCHEMES", "Aggregator", "build", "check_params", "register", "split_ranges"]


def register(aggregator: type[Aggregator]) -> None:
    """Make a scheme's aggregator buildable by name; its facts must be in the catalog already
    (``qbench.catalog.register_scheme``)."""
    if aggregator.name not in catalog.SCHEMES:
        raise UserError(
            f"scheme {aggregator.name!r} has no catalog entry; register it first with "
            "qbench.catalog.register_scheme"
        )
    SCHEMES[aggregator.name] = aggregator


def check_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Validate a scheme's name and parameters (the catalog's UserError naming the bad one);
    returns them complete, defaults filled in."""
    return catalog.scheme({"name": name, **params}).params


def build(
    name: str,
    comm: Comm,
    compressor: Compressor,
    numel: int,
    offset: int = 0,
    params: dict[str, Any] | None = None,
    tensors: Sequence[int] | None = None,
) -> Aggregator:
    """The aggregator of scheme ``name`` over ``numel`` values made of tensors of sizes
    ``tensors`` (default one tensor; per-tensor compressors encode each on its own); the DDP
    options (``backward``, ``bucket_cap_mb``, ...) belong to the DDP loop, not to the
    aggregator of one bucket."""
    checked = check_params(name, params or {})
    kwargs: dict[str, Any] = {k: v for k, v in checked.items() if k not in _DDP_KEYS}
    if EXCHANGE.name in kwargs:  # local SGD, DiLoCo: the collective of their outer step
        through = kwargs[EXCHANGE.name]
        kwargs[EXCHANGE.name] = lambda cm, c, n, off, t: build(through, cm, c, n, off, tensors=t)
    return _aggregator(name)(comm, compressor, numel, offset, tensors=tensors, **kwargs)


def _aggregator(name: str) -> type[Aggregator]:
    """The aggregator of scheme ``name``: registered, or imported from its catalog entry's
    ``aggregator`` path the first time (a plug-in's) and registered then."""
    if name not in SCHEMES:
        entry = catalog.SCHEMES[name]
        if not entry.aggregator:
            raise UserError(f"scheme {name} runs its own training loop; it has no aggregator")
        cls = importpath.resolve(entry.aggregator, f"scheme {name}: aggregator")
        if not (isinstance(cls, type) and issubclass(cls, Aggregator)) or cls.name != name:
            raise UserError(
                f"scheme {name}: aggregator {entry.aggregator!r} must be a "
                f"qbench.aggregate.Aggregator subclass whose name is {name!r}"
            )
        register(cls)
    return SCHEMES[name]


_DDP_KEYS = frozenset({BACKWARD.name, *(p.name for p in DDP_OPTIONS)})
