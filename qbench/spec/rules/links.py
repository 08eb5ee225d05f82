"""What emulated hosts and links allow: which backends they shape, and time dilation (which
slows shaped links only)."""

from __future__ import annotations

from qbench.catalog.schemes.spelling import overlap
from qbench.spec import network
from qbench.spec.rules.candidate import Candidate
from qbench.spec.rules.methods import Rule

EMULATING_BACKENDS = ("gloo", "mpi")
"""Backends whose ranks talk through the host's network stack, which emulated links shape."""


def emulation_problem(backend: str) -> str | None:
    """Why ``backend`` cannot run over emulated hosts or links, or None (the launchers and
    bench comm ask before they build namespaces)."""
    if backend in EMULATING_BACKENDS:
        return None
    return (
        f"network emulates hosts and links between CPU processes (gloo, mpi); {backend} "
        "would talk GPU to GPU inside one host and bypass them; use gloo or remove `network:`"
    )


def _network(c: Candidate) -> str | None:
    if not c.network or c.world_size is None:
        return None
    topo = network.topology(c.network, c.world_size, c.nodes)
    emulated = network.emulates_hosts(c.network) and c.launcher == "local"
    if topo.inter.shaped or topo.intra.shaped or emulated:
        return emulation_problem(c.backend)
    return None


def _dilation(c: Candidate) -> str | None:
    """Time dilation needs every link shaped (a link at memory speed cannot slow down) and
    codec work it can stretch (the flat loop's encode and decode phases)."""
    if c.dilation == 1 or c.world_size is None:
        return None
    topo = network.topology(c.network, c.world_size, c.nodes)
    if (topo.nodes > 1 and not topo.inter.shaped) or (
        topo.ranks_per_node > 1 and not topo.intra.shaped
    ):
        return (
            f"dilation: {c.dilation:g} slows shaped links only, and this network has an "
            "unshaped one; give every link a rate (`bandwidth:`, or `inter:` and `intra:` with "
            "`nodes:`)"
        )
    if overlap(c.scheme, c.params) == "backward" and c.compressor.name != "none":
        return (
            f"dilation: {c.dilation:g} stretches the codecs' time in the flat loop only; DDP's "
            "hooks and FSDP's collectives run theirs inside backward: use compressor none with "
            "DDP or FSDP, or a flat scheme"
        )
    return None


RULES: tuple[Rule, ...] = (_network, _dilation)
