"""Which training loop runs a planned run: the one place it is chosen.

``qbench.run.lifecycle`` builds what :func:`loop_for` names and asks nothing else of the spec:

* ``async-ps``: the asynchronous parameter server's event loop (seed 003, ``qbench.run.async_ps``);
* ``fsdp``: FSDP2's loop, its collectives inside backward (``qbench.run.loops.fsdp``);
* ``ddp``: DDP's buckets communicated during backward (``qbench.run.loops.ddp``);
* ``flat``: one flat gradient aggregated after backward (``qbench.run.loops.flat``).

``replayed``: the model's work is replayed from a measured timeline (``compute: replay``,
``qbench.run.replay.loops``); the planner refuses it for loops that cannot replay
(``qbench.spec.rules``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from qbench import catalog
from qbench.catalog.schemes import spelling
from qbench.spec.scenario import REPLAY

Loop = Literal["async-ps", "fsdp", "ddp", "flat"]


@dataclass(frozen=True)
class LoopChoice:
    loop: Loop
    replayed: bool = False


def loop_for(scheme: str, params: dict[str, Any], compute: str) -> LoopChoice:
    """The loop of a run of ``scheme`` (canonical, with its parameters) computing in
    ``compute``."""
    kind = catalog.SCHEMES[scheme].kind
    loop: Loop
    if kind == "asynchronous":
        loop = "async-ps"
    elif kind == "fsdp":
        loop = "fsdp"
    elif spelling.overlap(scheme, params) == "backward":
        loop = "ddp"
    else:
        loop = "flat"
    return LoopChoice(loop, replayed=compute == REPLAY)
