"""Launch one run's ranks on emulated hosts and links (see :mod:`qbench.launch.netns`).

gloo: every rank is ``ip netns exec <its node's ns> python -m qbench.run.worker SPEC`` with the
env:// variables torchrun would set (LOCAL_RANK / LOCAL_WORLD_SIZE: its place in its node),
rank 0's node address as MASTER_ADDR, and GLOO_SOCKET_IFNAME naming the node's interface, all in
one process group: the first rank to fail (or the timeout) kills them all.

mpi: mpirun runs in the hub namespace and starts ``python -m qbench.launch.nsexec`` per rank, which
enters that rank's namespace. Open MPI 5's PMIx server listens on TCP 127.0.0.1 by default, which
a rank in another namespace cannot reach, so it is told to listen on the hub's bridge address
instead (ranks reach it over their links: a few kB at start-up and exit). MPI traffic is forced
onto TCP over the links: pml ob1, btl tcp,self (no shared memory), btl_tcp_if_include the subnet,
and collectives chosen as across nodes (no han / coll sm, which assume one shared-memory host).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbench.errors import UserError
from qbench.launch import local, netns, procs, rank_server
from qbench.spec import network, rules
from qbench.spec.runspec import RunSpec

if TYPE_CHECKING:
    from qbench.launch.launcher import Item, Outcome

MASTER_PORT = 29500  # rank 0's own namespace: nothing else listens there
POLL_S = 0.05


def describe(spec: RunSpec) -> dict[str, object]:
    """Provenance of a run's emulated hosts and links: the setting, the placement and the tbf
    parameters applied (None: that level is not shaped)."""
    topo = spec.shaped_topology
    doc: dict[str, object] = {
        "shaped": topo.inter.shaped or topo.intra.shaped,
        "setting": spec.placement.network.written(), "label": spec.link.label,
        "nodes": topo.nodes, "ranks_per_node": topo.ranks_per_node,
        "method": "netns + veth per node, tc tbf both directions between nodes"
        + (", tc tbf on each node's loopback" if topo.intra.shaped else ""),
        "dilation": spec.clock.dilation,  # the tbf rates below are the labels' rates / dilation
    }  # fmt: skip
    for level, link in (("tbf", topo.inter), ("intra_tbf", topo.intra)):
        tbf = None if link.bits_per_s is None else netns.tbf_for(link.bits_per_s)
        doc[level] = None if tbf is None else {
            "rate_bits": tbf.rate_bits, "burst_bytes": tbf.burst_bytes,
            "latency_ms": tbf.latency_ms,
        }  # fmt: skip
    return doc


def gloo_rank_argv(net: netns.ShapedNetwork, rank: int, program: list[str]) -> list[str]:
    return netns.netns_exec(net.rank_ns(rank), program)


def gloo_rank_env(net: netns.ShapedNetwork, rank: int, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(net.world_size),
        "LOCAL_RANK": str(rank % net.ranks_per_node),
        "LOCAL_WORLD_SIZE": str(net.ranks_per_node), "MASTER_ADDR": net.rank_addr(0),
        "MASTER_PORT": str(MASTER_PORT),
        "GLOO_SOCKET_IFNAME": netns.RANK_IF,  # gloo would pick the host name's address otherwise
    })  # fmt: skip
    return env


def node_torchrun_argv(
    net: netns.ShapedNetwork, node: int, program: list[str], python: str = sys.executable
) -> list[str]:
    """torchrun as on a cluster node: ``--nnodes N --node-rank i`` with a c10d rendezvous at node
    0's address, inside node i's namespace. The host name, which every namespace shares,
    resolves to no emulated node, so each agent is given its node's address (``--local-addr``)
    and whether it hosts the rendezvous store (``is_host``; torch would guess from the name).
    c10d orders nodes as they join, so the ranks of a node stay consecutive but node i may
    get ranks other than iG..iG+G-1 (``--node-rank`` is for static rendezvous; torchrun says so)."""
    return netns.netns_exec(net.node_ns(node), [
        python, "-m", "torch.distributed.run", "--nnodes", str(net.nodes),
        "--node-rank", str(node), "--nproc-per-node", str(net.ranks_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{net.node_addr(0)}:{MASTER_PORT}",
        "--rdzv-id", net.stem, "--rdzv-conf", f"is_host={int(node == 0)}",
        "--local-addr", net.node_addr(node), "--max-restarts", "0",
        *program[1:],  # torchrun runs the program's script or module with this Python
    ])  # fmt: skip


def node_torchrun_env(base: Mapping[str, str]) -> dict[str, str]:
    return {**base, "GLOO_SOCKET_IFNAME": netns.RANK_IF}


def mpirun_argv(
    net: netns.ShapedNetwork, program: list[str], mpirun: str, python: str = sys.executable
) -> list[str]:
    template = f"{net.stem}-n{{node}}"
    return netns.netns_exec(net.hub, [
        mpirun, "-np", str(net.world_size), "--oversubscribe", "--bind-to", "none",
        "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
        "--mca", "btl_tcp_if_include", net.subnet,
        # Every rank emulates its own node, but Open MPI sees one host: han would run allreduce
        # as an intra-node reduce + bcast (half the link used at a time) and coll sm would share
        # memory past the links; without them tuned picks what it would pick across nodes.
        "--mca", "coll", "^han,sm",
        python, "-m", "qbench.launch.nsexec", template, str(net.ranks_per_node), *program,
    ])  # fmt: skip


def mpirun_cluster_argv(
    net: netns.ShapedNetwork, program: list[str], mpirun: str, hostfile: Path,
    python: str = sys.executable,
) -> list[str]:  # fmt: skip
    """mpirun across the emulated nodes as across a cluster's: a hostfile of their addresses and
    a remote-shell agent (:mod:`qbench.launch.nsagent`) that starts each node's daemon in its
    namespace. Open MPI's own choices then hold: TCP between nodes, shared memory inside one."""
    return netns.netns_exec(net.hub, [
        mpirun, "-np", str(net.world_size), "--hostfile", str(hostfile), "--bind-to", "none",
        "--mca", "plm_ssh_agent", f"{python} -m qbench.launch.nsagent {net.stem}",
        "--prtemca", "prte_if_include", net.subnet, "--mca", "btl_tcp_if_include", net.subnet,
        *program,
    ])  # fmt: skip


def hostfile_text(net: netns.ShapedNetwork) -> str:
    return "".join(f"{net.node_addr(n)} slots={net.ranks_per_node}\n" for n in range(net.nodes))


# Open MPI's TCP transport sends a message over its eager limit (64 KiB by default) by
# rendezvous: a request, the receiver's reply, then the rest. Two ranks exchanging large
# messages over one TCP connection each way (an allreduce) queue each reply behind their own
# bulk data, up to a socket buffer of it (megabytes, tens of ms at 1 Gbit/s); whether a reply
# lands there depends on timing, so identical allreduces took 1x, 1.5x or 2x the wire time
# (docs/results/comm.md). Sent eagerly, a message needs no reply. Up to this size it is (the
# receiver buffers an unexpected one: +32 MiB of peak memory measured at 32 MiB); the user's
# own OMPI_MCA_btl_tcp_eager_limit wins.
MPI_TCP_EAGER_BYTES = 64 * 2**20


def mpirun_env(base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    # PMIx servers (mpirun's, and each node daemon's, which inherit this) listen on the emulated
    # subnet: the bridge in the hub, eth0 in a node; both reachable from every node.
    env["PMIX_MCA_ptl_tcp_if_include"] = netns.SUBNET + ".0/24"
    if "OMPI_MCA_btl_tcp_eager_limit" not in env:
        eager = str(MPI_TCP_EAGER_BYTES)
        env |= {"OMPI_MCA_btl_tcp_eager_limit": eager, "OMPI_MCA_btl_tcp_rndv_eager_limit": eager}
    return env


class Emulated:
    """Runs on emulated hosts of this machine (``network:``): the
    ``qbench.launch.launcher.Launcher`` that the local launcher's runs with a network get."""

    name = "local"  # the sweep's launcher: emulated hosts are this host's

    def run(self, spec: RunSpec, spec_path: Path, run_dir: Path) -> Outcome:
        return run_shaped(spec, spec_path, run_dir, spec.measurement.timeout)

    @contextmanager
    def group_jobs(self, spec: RunSpec, plan: Path) -> Iterator[list[procs.Job]]:
        """One process per rank in its node's namespace (which lives as long as the block),
        or mpirun in the hub's."""
        program = [sys.executable, *local.WORKER, str(plan)]
        fork = (
            spec.placement.device_kind == "cpu"
            and spec.placement.backend != "mpi"
            and rank_server.enabled()
        )
        if fork:  # its imports overlap the namespaces' set-up
            rank_server.warm(local.worker_env(), procs.die_with_parent)
        with shaped_jobs(spec.placement.backend, spec.shaped_topology, program, fork=fork) as jobs:
            yield jobs

    def run_array(self, items: list[Item], work_dir: Path) -> list[Outcome]:
        raise NotImplementedError("job arrays are Slurm's; a local sweep runs its runs in turn")

    def network(self, spec: RunSpec) -> dict[str, Any]:
        return describe(spec)

    def needs(self, spec: RunSpec) -> tuple[str, ...]:
        return ("netns", "cuda") if spec.placement.device_kind == "cuda" else ("netns",)


def run_shaped(
    spec: RunSpec, spec_path: Path, run_dir: Path, timeout: float
) -> tuple[str, int | None]:
    """One run on emulated hosts: logs in run_dir, status ok / failed / timeout."""
    program = [sys.executable, *local.WORKER, str(spec_path)]
    nodes = (
        spec.placement.network.nodes is not None
    )  # a cluster starts as clusters do; a flat star: the ranks
    topo = spec.shaped_topology
    return run_program(spec.placement.backend, topo, program, run_dir, timeout, cluster=nodes)


def run_program(
    backend: str,
    topo: network.Topology,
    program: list[str],
    run_dir: Path,
    timeout: float,
    prefix: str = "qb",
    cluster: bool = False,
) -> tuple[str, int | None]:
    """Run ``program`` on the ranks of ``topo``, each in its node's namespace; wait for all."""
    with shaped_jobs(backend, topo, program, prefix, cluster) as jobs:
        return procs.run_jobs(jobs, run_dir, timeout)


@contextmanager
def shaped_jobs(
    backend: str, topo: network.Topology, program: list[str], prefix: str = "qb",
    cluster: bool = False, fork: bool = False,
) -> Iterator[list[procs.Job]]:  # fmt: skip
    """The jobs that run ``program`` on the ranks of ``topo`` on emulated hosts, valid while
    the block runs (the namespaces are removed when it ends). With ``cluster``, started as on a
    cluster: gloo by one torchrun per node, mpi by mpirun with a hostfile and a remote-shell
    agent; without, gloo's ranks themselves (a warm rank group, the flat star; with ``fork``
    forked by the rank server into their namespaces) and mpi by mpirun in the hub, which sees
    one host."""
    why = rules.emulation_problem(backend)
    if why:
        raise UserError(why)
    mpirun = local.find_mpirun() if backend == "mpi" else ""
    base = local.worker_env()
    with netns.shaped_network(topo, prefix) as net, tempfile.TemporaryDirectory() as tmp:
        if backend == "mpi" and cluster:  # mpirun's own multi-node start
            hostfile = Path(tmp) / "hostfile"
            hostfile.write_text(hostfile_text(net))
            jobs = [(mpirun_cluster_argv(net, program, mpirun, hostfile), mpirun_env(base))]
        elif backend == "mpi":
            jobs = [(mpirun_argv(net, program, mpirun), mpirun_env(base))]
        elif cluster:
            jobs = [(node_torchrun_argv(net, n, program), node_torchrun_env(base))
                    for n in range(net.nodes)]  # fmt: skip
        else:
            jobs = [(gloo_rank_argv(net, r, program), gloo_rank_env(net, r, base))
                    for r in range(net.world_size)]  # fmt: skip
        # `ip` (and mpirun) by absolute path: sbin may be missing from PATH
        jobs = [([netns.tool(argv[0]), *argv[1:]], env) for argv, env in jobs]
        if fork and not cluster and backend != "mpi":
            jobs = [(rank_server.forked_argv(argv), env) for argv, env in jobs]
        yield jobs
