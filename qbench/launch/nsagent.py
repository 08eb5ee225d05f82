"""Open MPI's remote-shell agent for emulated nodes: where mpirun would ``ssh HOST COMMAND``,
enter HOST's network namespace with a hostname of its own and run COMMAND there.

usage: python -m qbench.launch.nsagent STEM HOST COMMAND...

mpirun (``--mca plm_ssh_agent "python -m qbench.launch.nsagent STEM"``, a hostfile of the
nodes' addresses) starts its daemon on every node through this, as it would over ssh on a
cluster; the daemons then start the ranks, wire them up and carry their traffic over TCP
between nodes (and shared memory inside one). HOST is a node's address, 10.213.1.<k+1>, whose
namespace is ``STEM-n<k>`` (:mod:`qbench.launch.netns`); its own UTS namespace gives it the
hostname ``STEM-n<k>``, so Open MPI sees as many hosts as there are nodes.
"""

from __future__ import annotations

import os
import shutil
import sys

from qbench.launch import netns


def node_of(host: str) -> int:
    """The node whose address ``host`` is (``10.213.1.3`` -> 2)."""
    prefix, _, last = host.rpartition(".")
    if prefix != netns.SUBNET or not last.isdigit() or not 1 <= int(last) <= netns.MAX_RANKS:
        raise SystemExit(f"qbench.launch.nsagent: {host!r} is no emulated node's address")
    return int(last) - 1


def argv_for(stem: str, host: str, command: list[str], unshare: str = "unshare") -> list[str]:
    """``ip netns exec NODE unshare --uts sh -c 'hostname NODE; COMMAND'`` (ssh hands the remote
    side one shell line, and mpirun's COMMAND is written for that)."""
    ns = f"{stem}-n{node_of(host)}"
    line = f"hostname {ns} && {' '.join(command)}"
    return netns.netns_exec(ns, [unshare, "--uts", "sh", "-c", line])


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3:
        raise SystemExit(__doc__)
    unshare = shutil.which("unshare") or "unshare"
    os.execv(netns.tool("ip"), argv_for(args[0], args[1], args[2:], unshare))


if __name__ == "__main__":
    main()
