"""Per-rank trampoline under mpirun: enter this rank's node's network namespace, then run the
program.

usage: python -m qbench.launch.nsexec NAMESPACE_TEMPLATE RANKS_PER_NODE PROGRAM [ARGS...]

``{node}`` in the template is replaced by this process's MPI rank (OMPI_COMM_WORLD_RANK, set by
mpirun) over RANKS_PER_NODE, and LOCAL_WORLD_SIZE / LOCAL_RANK are set as torchrun would (where
qbench reads a rank's node, ``qbench.comm.env``). ``ip netns exec`` then execs the program in
place, so mpirun's child is the rank itself.
"""

from __future__ import annotations

import os
import sys

from qbench.comm import MPI_RANK_VARS as RANK_VARS
from qbench.launch import netns


def argv_for(template: str, node: int, program: list[str]) -> list[str]:
    return netns.netns_exec(template.format(node=node), program)


def rank_from(env: dict[str, str]) -> int:
    for var in RANK_VARS:
        if var in env:
            return int(env[var])
    raise SystemExit(f"qbench.launch.nsexec: none of {', '.join(RANK_VARS)} set; run under mpirun")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or not args[1].isdigit():
        raise SystemExit(__doc__)
    rank, per_node = rank_from(dict(os.environ)), int(args[1])
    os.environ.update(LOCAL_WORLD_SIZE=str(per_node), LOCAL_RANK=str(rank % per_node))
    os.execv(netns.tool("ip"), argv_for(args[0], rank // per_node, args[2:]))


if __name__ == "__main__":
    main()
