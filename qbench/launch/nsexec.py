"""Per-rank trampoline under mpirun: enter this rank's network namespace, then run the program.

usage: python -m qbench.launch.nsexec NAMESPACE_TEMPLATE PROGRAM [ARGS...]

``{rank}`` in the template is replaced by this process's MPI rank (OMPI_COMM_WORLD_RANK, set by
mpirun). ``ip netns exec`` then execs the program in place, so mpirun's child is the rank itself.
"""

from __future__ import annotations

import os
import sys

from qbench.comm import MPI_RANK_VARS as RANK_VARS
from qbench.launch import netns


def argv_for(template: str, rank: int, program: list[str]) -> list[str]:
    return netns.netns_exec(template.format(rank=rank), program)


def rank_from(env: dict[str, str]) -> int:
    for var in RANK_VARS:
        if var in env:
            return int(env[var])
    raise SystemExit(f"qbench.launch.nsexec: none of {', '.join(RANK_VARS)} set; run under mpirun")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        raise SystemExit(__doc__)
    cmd = argv_for(args[0], rank_from(dict(os.environ)), args[1:])
    os.execv(netns.tool("ip"), cmd)


if __name__ == "__main__":
    main()
