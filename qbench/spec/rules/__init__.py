"""Which planned runs can run: every combination rule, each with the one-line reason shown.

The one rule site. ``why_not(candidate)`` returns the first rule a
:class:`~qbench.spec.rules.candidate.Candidate` breaks, or None. The matrix, ``bench comm``, the
cost model and the DDP hook ask it, and none of them filters on its own. A combination that
cannot run is never dropped silently: ``matrix.expand`` lists it as excluded with this reason
(``qbench sweep --dry-run`` prints them). The rules, in the order they are asked:

* :mod:`.methods`: the scheme, its compressors and the backend under them;
* :mod:`.links`: emulated hosts and links, time dilation;
* :mod:`.workload`: replayed codec time, FSDP's shards, text corpora;
* :mod:`.devices`: which device a backend reduces on, GPUs per node.

A scenario's ``include`` / ``exclude`` and ``cover`` choose among the runs that can run; they
are the user's selection, not rules, and stay in the matrix.
"""

from __future__ import annotations

from typing import Any

from qbench import catalog
from qbench.spec.rules import devices, links, methods, workload
from qbench.spec.rules.candidate import Candidate
from qbench.spec.rules.devices import device_for, natural_device, torch_ddp
from qbench.spec.rules.links import emulation_problem
from qbench.spec.rules.methods import Rule

__all__ = [
    "RULES", "Candidate", "Rule", "device_for", "emulation_problem", "incompatibility",
    "natural_device", "torch_ddp", "why_not",
]  # fmt: skip

RULES: tuple[Rule, ...] = (*methods.RULES, *links.RULES, *workload.RULES, *devices.RULES)


def why_not(candidate: Candidate) -> str | None:
    """The first rule the candidate breaks, or None when it can run."""
    return next((why for rule in RULES if (why := rule(candidate))), None)


def incompatibility(
    backend: str,
    scheme: str,
    comp: catalog.CompressorSpec,
    *,
    world_size: int | None = None,
    params: dict[str, Any] | None = None,
    collective: bool = False,
) -> str | None:
    """Why one compressor cannot run under ``scheme`` on ``backend``, or None: ``why_not`` for
    callers that know only the method (bench, the DDP hooks, the cost model, tests)."""
    candidate = Candidate(
        backend=backend, scheme=scheme, compressor=comp, params=params or {},
        world_size=world_size, collective=collective,
    )  # fmt: skip
    return why_not(candidate)
