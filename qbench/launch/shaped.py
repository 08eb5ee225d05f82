"""Launch one run's ranks over emulated links (see :mod:`qbench.launch.netns`).

gloo: every rank is ``ip netns exec <rank ns> python -m qbench.run.worker SPEC`` with the env://
variables torchrun would set, rank 0's address as MASTER_ADDR, and GLOO_SOCKET_IFNAME naming the
shaped interface, all in one process group: the first rank to fail (or the timeout) kills them all.

mpi: mpirun runs in the hub namespace and starts ``python -m qbench.launch.nsexec`` per rank, which
enters that rank's namespace. Open MPI 5's PMIx server listens on TCP 127.0.0.1 by default, which
a rank in another namespace cannot reach, so it is told to listen on the hub's bridge address
instead (ranks reach it over their links: a few kB at start-up and exit). MPI traffic is forced
onto TCP over the links: pml ob1, btl tcp,self (no shared memory), btl_tcp_if_include the subnet,
and collectives chosen as across nodes (no han / coll sm, which assume one shared-memory host).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from qbench.errors import UserError
from qbench.launch import local, netns, procs
from qbench.spec.matrix import RunSpec

MASTER_PORT = 29500  # rank 0's own namespace: nothing else listens there
POLL_S = 0.05
BACKENDS = ("gloo", "mpi")


def unsupported(backend: str) -> str | None:
    """Why ``backend`` cannot run over emulated links, or None (for matrix exclusion)."""
    if backend in BACKENDS:
        return None
    return (
        f"network.bandwidth emulates links between CPU processes (gloo, mpi); backend {backend} "
        "would talk GPU to GPU inside one host and bypass them; use gloo or remove `network:`"
    )


def describe(spec: RunSpec) -> dict[str, object]:
    """Provenance of a run's emulated link: the setting and the tbf parameters applied to it."""
    assert spec.link.bits_per_s is not None, "describe() is for shaped runs"
    tbf = netns.tbf_for(spec.link.bits_per_s)
    return {
        "shaped": True, "setting": dict(spec.network), "label": spec.link.label,
        "method": "netns + veth per rank, tc tbf both directions",
        "tbf": {"rate_bits": tbf.rate_bits, "burst_bytes": tbf.burst_bytes,
                "latency_ms": tbf.latency_ms},
    }  # fmt: skip


def gloo_rank_argv(net: netns.ShapedNetwork, rank: int, program: list[str]) -> list[str]:
    return netns.netns_exec(net.rank_ns(rank), program)


def gloo_rank_env(net: netns.ShapedNetwork, rank: int, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(net.world_size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(net.world_size), "MASTER_ADDR": net.rank_addr(0),
        "MASTER_PORT": str(MASTER_PORT),
        "GLOO_SOCKET_IFNAME": netns.RANK_IF,  # gloo would pick the host name's address otherwise
    })  # fmt: skip
    return env


def mpirun_argv(
    net: netns.ShapedNetwork, program: list[str], mpirun: str, python: str = sys.executable
) -> list[str]:
    template = f"{net.stem}-r{{rank}}"
    return netns.netns_exec(net.hub, [
        mpirun, "-np", str(net.world_size), "--oversubscribe", "--bind-to", "none",
        "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
        "--mca", "btl_tcp_if_include", net.subnet,
        # Every rank emulates its own node, but Open MPI sees one host: han would run allreduce
        # as an intra-node reduce + bcast (half the link used at a time) and coll sm would share
        # memory past the links; without them tuned picks what it would pick across nodes.
        "--mca", "coll", "^han,sm",
        python, "-m", "qbench.launch.nsexec", template, *program,
    ])  # fmt: skip


def mpirun_env(base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    # The PMIx server inside mpirun: listen on the bridge (reachable from every rank namespace).
    env["PMIX_MCA_ptl_tcp_if_include"] = netns.BRIDGE
    return env


def run_shaped(
    spec: RunSpec, spec_path: Path, run_dir: Path, timeout: float
) -> tuple[str, int | None]:
    """Same contract as ``sweep._launch``: logs in run_dir, status ok / failed / timeout."""
    program = [sys.executable, *local.WORKER, str(spec_path)]
    assert spec.link.bits_per_s is not None, "run_shaped() is for shaped runs"
    return run_program(spec.backend, spec.world_size, spec.link.bits_per_s, program, run_dir,
                       timeout)  # fmt: skip


def run_program(
    backend: str,
    world_size: int,
    bandwidth_bits_per_s: float,
    program: list[str],
    run_dir: Path,
    timeout: float,
    prefix: str = "qb",
) -> tuple[str, int | None]:
    """Run ``program`` on ``world_size`` ranks over links of the given rate; wait for all."""
    with shaped_jobs(backend, world_size, bandwidth_bits_per_s, program, prefix) as jobs:
        return procs.run_jobs(jobs, run_dir, timeout)


@contextmanager
def shaped_jobs(
    backend: str, world_size: int, bandwidth_bits_per_s: float, program: list[str],
    prefix: str = "qb",
) -> Iterator[list[procs.Job]]:  # fmt: skip
    """The jobs that run ``program`` on ``world_size`` ranks over links of the given rate,
    valid while the block runs (the namespaces are removed when it ends)."""
    why = unsupported(backend)
    if why:
        raise UserError(why)
    mpirun = local.find_mpirun() if backend == "mpi" else ""
    base = local.worker_env()
    with netns.shaped_network(world_size, bandwidth_bits_per_s, prefix) as net:
        if backend == "mpi":
            jobs = [(mpirun_argv(net, program, mpirun), mpirun_env(base))]
        else:
            jobs = [(gloo_rank_argv(net, r, program), gloo_rank_env(net, r, base))
                    for r in range(world_size)]  # fmt: skip
        # `ip` (and mpirun) by absolute path: sbin may be missing from PATH
        yield [([netns.tool(argv[0]), *argv[1:]], env) for argv, env in jobs]
