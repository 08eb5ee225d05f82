"""Emulated links: argv builders (pure, no root) and, as root, real shaped networks.

The slow tests build namespaces with the prefix ``qbtest`` and check none is left afterwards,
also after a failing rank, a timeout and an interrupt.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qbench.errors import UserError
from qbench.launch import local, netns, nsagent, nsexec, shaped
from qbench.launch import procs as run
from qbench.spec import network
from qbench.spec.runspec import RunSpec
from tests.distributed import here, launch

PREFIX = "qbtest"
PROG = here("netns_prog.py")


def _net(world_size: int = 2, rate: float = 1e9) -> netns.ShapedNetwork:
    """A flat star: a node per rank."""
    return netns.ShapedNetwork(stem="qb-42-0", nodes=world_size, tbf=netns.tbf_for(rate))


def _star(world_size: int, rate: float) -> network.Topology:
    return network.Topology(world_size, 1, network.at_rate(rate))


# ---- pure ----------------------------------------------------------------------------------


def test_tbf_burst_is_2ms_of_traffic_with_a_16k_floor() -> None:
    assert netns.tbf_for(1e9) == netns.Tbf(rate_bits=10**9, burst_bytes=250_000, latency_ms=50)
    assert netns.tbf_for(1e8).burst_bytes == 25_000
    assert netns.tbf_for(1e6).burst_bytes == 16 * 1024


def test_names_and_addresses() -> None:
    net = _net(3)
    assert net.namespaces == ["qb-42-0-hub", "qb-42-0-n0", "qb-42-0-n1", "qb-42-0-n2"]
    assert [net.rank_addr(r) for r in range(3)] == ["10.213.1.1", "10.213.1.2", "10.213.1.3"]
    assert (net.hub_addr, net.subnet) == ("10.213.1.254", "10.213.1.0/24")


def test_argv_builders() -> None:
    tbf = netns.Tbf(rate_bits=100_000_000, burst_bytes=25_000, latency_ms=50)
    assert netns.tbf_add("ns", "eth0", tbf) == [
        "tc", "-n", "ns", "qdisc", "add", "dev", "eth0", "root", "tbf",
        "rate", "100000000bit", "burst", "25000", "latency", "50ms",
    ]  # fmt: skip
    assert netns.veth_add("hub", "p1", "eth0", "r1") == [
        "ip", "-n", "hub", "link", "add", "p1", "type", "veth", "peer", "name", "eth0",
        "netns", "r1",
    ]  # fmt: skip
    assert netns.netns_exec("r0", ["python", "-V"]) == ["ip", "netns", "exec", "r0", "python", "-V"]
    assert netns.addr_add("r0", "eth0", "10.213.1.1/24") == [
        "ip", "-n", "r0", "addr", "add", "10.213.1.1/24", "dev", "eth0",
    ]  # fmt: skip
    assert netns.netns_delete("r0") == ["ip", "netns", "delete", "r0"]


def test_setup_stays_inside_its_namespaces_and_shapes_both_directions() -> None:
    net = _net(2)
    cmds = netns.setup_commands(net)
    assert all(isinstance(a, str) for c in cmds for a in c)
    added = [c[3] for c in cmds if c[:3] == ["ip", "netns", "add"]]
    assert added == net.namespaces
    for c in cmds:
        if c[:3] != ["ip", "netns", "add"]:
            assert c[1] == "-n" and c[2] in net.namespaces, c  # never the host's namespace
    shaped_devs = {(c[2], c[6]) for c in cmds if c[0] == "tc"}
    assert shaped_devs == {("qb-42-0-n0", "eth0"), ("qb-42-0-n1", "eth0"),
                           ("qb-42-0-hub", "p0"), ("qb-42-0-hub", "p1")}  # fmt: skip
    addrs = [c[5] for c in cmds if c[3:5] == ["addr", "add"]]
    assert addrs == ["10.213.1.254/24", "10.213.1.1/24", "10.213.1.2/24"]


def test_nodes_hold_consecutive_ranks_and_only_links_between_them_are_shaped() -> None:
    tbf = netns.tbf_for(1e8)
    net = netns.ShapedNetwork(stem="qb-42-0", nodes=2, ranks_per_node=2, tbf=tbf)
    assert net.world_size == 4 and net.namespaces == ["qb-42-0-hub", "qb-42-0-n0", "qb-42-0-n1"]
    assert [net.rank_ns(r)[-2:] for r in range(4)] == ["n0", "n0", "n1", "n1"]
    assert [net.rank_addr(r) for r in range(4)] == ["10.213.1.1"] * 2 + ["10.213.1.2"] * 2
    shaped_devs = {(c[2], c[6]) for c in netns.setup_commands(net) if c[0] == "tc"}
    assert shaped_devs == {("qb-42-0-n0", "eth0"), ("qb-42-0-n1", "eth0"),
                           ("qb-42-0-hub", "p0"), ("qb-42-0-hub", "p1")}  # fmt: skip
    env = shaped.gloo_rank_env(net, 3, {})
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["MASTER_ADDR"]) == (
        "1",
        "2",
        "10.213.1.1",
    )
    assert "nsexec qb-42-0-n{node} 2 p" in " ".join(shaped.mpirun_argv(net, ["p"], "m", "py"))


def test_mpirun_across_nodes_with_a_hostfile_and_the_namespace_agent(tmp_path: Path) -> None:
    net = netns.ShapedNetwork(stem="qb-42-0", nodes=2, ranks_per_node=2, tbf=None)
    assert shaped.hostfile_text(net) == "10.213.1.1 slots=2\n10.213.1.2 slots=2\n"
    argv = shaped.mpirun_cluster_argv(net, ["py", "w.py"], "/x/mpirun", tmp_path / "h", "py")
    joined = " ".join(argv)
    assert argv[:5] == ["ip", "netns", "exec", "qb-42-0-hub", "/x/mpirun"]
    assert f"-np 4 --hostfile {tmp_path / 'h'}" in joined and joined.endswith(" py w.py")
    assert "plm_ssh_agent py -m qbench.launch.nsagent qb-42-0 " in joined
    assert nsagent.node_of("10.213.1.2") == 1
    assert nsagent.argv_for("qb-42-0", "10.213.1.2", ["prted", "--x"], "unshare") == [
        "ip", "netns", "exec", "qb-42-0-n1", "unshare", "--uts", "sh", "-c",
        "hostname qb-42-0-n1 && prted --x",
    ]  # fmt: skip
    for bad in ("10.0.0.2", "10.213.1.x", "10.213.1.0"):
        with pytest.raises(SystemExit, match="no emulated node's address"):
            nsagent.node_of(bad)


def test_torchrun_per_node_as_on_a_cluster() -> None:
    net = netns.ShapedNetwork(stem="qb-42-0", nodes=2, ranks_per_node=2, tbf=None)
    argv = shaped.node_torchrun_argv(net, 1, ["py", "-m", "qbench.run.worker", "s.json"], "py")
    assert argv[:5] == ["ip", "netns", "exec", "qb-42-0-n1", "py"]
    joined = " ".join(argv)
    for part in (
        "--nnodes 2 --node-rank 1 --nproc-per-node 2",
        "--rdzv-backend c10d",
        "--rdzv-endpoint 10.213.1.1:29500",
        "--rdzv-conf is_host=0",
        "--local-addr 10.213.1.2",
        "--max-restarts 0 -m qbench.run.worker s.json",
    ):
        assert part in joined, part  # fmt: skip
    assert "is_host=1" in " ".join(shaped.node_torchrun_argv(net, 0, ["py", "x.py"], "py"))


def test_an_intra_rate_shapes_each_loopback_and_no_inter_rate_leaves_veths_free() -> None:
    intra = netns.tbf_for(2e9)
    net = netns.ShapedNetwork(stem="qb-42-0", nodes=2, ranks_per_node=2, tbf=None, intra_tbf=intra)
    tc = [c for c in netns.setup_commands(net) if c[0] == "tc"]
    assert {(c[2], c[6]) for c in tc} == {("qb-42-0-n0", "lo"), ("qb-42-0-n1", "lo")}
    assert all("2000000000bit" in c for c in tc)
    # tbf drops packets larger than its bucket: the loopback gets an Ethernet MTU first
    assert netns.set_mtu("qb-42-0-n0", "lo", 1500) in netns.setup_commands(net)


def test_stale_namespaces_only_of_this_prefix_and_dead_processes() -> None:
    names = ["qb-10-0-hub", "qb-10-0-r0", "qb-10-0-n1", "qb-11-2-r1", "qbx-10-0-hub",
             "qb-10-hub", "qb-10-0-x1", "other"]  # fmt: skip
    assert netns.stale_namespaces(names, "qb", alive=lambda pid: pid == 11) == [
        "qb-10-0-hub",
        "qb-10-0-r0",
        "qb-10-0-n1",
    ]


def test_teardown_deletes_again_until_nothing_is_listed_and_warns_about_what_stays(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """CI twice saw a cluster launch's namespaces survive teardown, with no message kept: a
    refused delete and one that exits 0 yet leaves the name listed are both tried again."""
    net = _net(2)
    hub, n0, n1 = net.namespaces
    present = set(net.namespaces)
    refusals = {hub: 2, n0: 99}  # hub refused twice, n0 for good
    silent = {n1: 1}  # n1: exits 0 once but stays listed

    def delete(ns: str) -> None:
        if refusals.get(ns, 0) > 0:
            refusals[ns] -= 1
            raise RuntimeError(f"`ip netns delete {ns}` failed: Device or resource busy")
        if silent.get(ns, 0) > 0:
            silent[ns] -= 1
            return
        present.discard(ns)

    monkeypatch.setattr(netns, "list_namespaces", lambda: sorted(present))
    monkeypatch.setattr(netns, "delete_namespace", delete)
    # a pid above any pid_max (2**22): no /proc entry names it
    monkeypatch.setattr(netns, "run", lambda argv: "4194305\n" if argv[2] == "pids" else "")
    netns.teardown(net, pauses=(0.0, 0.0, 0.0))
    assert sorted(present) == [n0]
    assert capsys.readouterr().err.splitlines() == [
        f"qbench: could not delete network namespace {n0}: "
        f"`ip netns delete {n0}` failed: Device or resource busy; pids inside: 4194305"
    ]
    silent[n0], refusals[n0] = 99, 0  # n0 now exits 0 each time, but stays listed
    netns.teardown(net, pauses=(0.0,))
    assert capsys.readouterr().err.splitlines() == [
        f"qbench: could not delete network namespace {n0}: "
        "still listed after `ip netns delete` exited 0; pids inside: 4194305"
    ]


def test_not_root_or_missing_tools_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match=r"needs root .* remove `network:`"):
        netns.check_available()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    with pytest.raises(UserError, match=r"needs the `ip` command \(iproute2\)"):
        netns.check_available()


def test_gloo_rank_env_points_at_rank0_over_the_shaped_interface() -> None:
    env = shaped.gloo_rank_env(_net(2), 1, {"PATH": "/bin"})
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "0"
    assert env["MASTER_ADDR"] == "10.213.1.1" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert shaped.gloo_rank_argv(_net(2), 1, ["py"]) == ["ip", "netns", "exec", "qb-42-0-n1", "py"]
    assert env["LOCAL_WORLD_SIZE"] == "1"  # a host per rank


def test_mpirun_argv_forces_tcp_over_the_links() -> None:
    argv = shaped.mpirun_argv(_net(2), ["py", "prog"], "/x/mpirun", python="py")
    assert argv[:5] == ["ip", "netns", "exec", "qb-42-0-hub", "/x/mpirun"]
    joined = " ".join(argv)
    assert "--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 10.213.1.0/24" in joined
    assert joined.endswith("py -m qbench.launch.nsexec qb-42-0-n{node} 1 py prog")
    # PMIx listens on the emulated subnet: the bridge in the hub, eth0 in a node daemon
    assert shaped.mpirun_env({})["PMIX_MCA_ptl_tcp_if_include"] == "10.213.1.0/24"


def test_mpi_sends_eagerly_over_the_links_unless_the_user_says_otherwise() -> None:
    """No rendezvous reply to queue behind bulk data (docs/results/comm.md): 64 MiB eagerly."""
    env = shaped.mpirun_env({})
    assert env["OMPI_MCA_btl_tcp_eager_limit"] == env["OMPI_MCA_btl_tcp_rndv_eager_limit"]
    assert int(env["OMPI_MCA_btl_tcp_eager_limit"]) == 64 * 2**20
    mine = shaped.mpirun_env({"OMPI_MCA_btl_tcp_eager_limit": "65536"})
    assert mine["OMPI_MCA_btl_tcp_eager_limit"] == "65536"
    assert "OMPI_MCA_btl_tcp_rndv_eager_limit" not in mine


def test_nsexec_enters_the_rank_namespace() -> None:
    assert nsexec.rank_from({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert nsexec.argv_for("qb-1-0-n{node}", 3, ["py"]) == [
        "ip", "netns", "exec", "qb-1-0-n3", "py",
    ]  # fmt: skip
    with pytest.raises(SystemExit, match="run under mpirun"):
        nsexec.rank_from({})


def test_nccl_is_refused_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"network emulates hosts and links .* nccl would"):
        shaped.run_program("nccl", _star(2, 1e9), ["true"], tmp_path, 10)


def test_a_dead_rank_kills_the_others(tmp_path: Path) -> None:
    """The process-group logic without namespaces: one job exits 3, the sleeper is killed."""
    procs: list[subprocess.Popen[bytes]] = []
    with open(tmp_path / "o", "wb") as out:
        t0 = time.monotonic()
        try:
            jobs = [(["sleep", "60"], dict(os.environ)), (["sh", "-c", "exit 3"], dict(os.environ))]
            run.start(jobs, procs, out, out)
            assert run.wait_all(procs, timeout=30) == ("failed", 3)
        finally:
            run.kill_group(procs)
    assert time.monotonic() - t0 < 10
    assert procs[0].returncode in (-15, -9)  # SIGTERM first, SIGKILL after the grace period


# ---- as root: real namespaces --------------------------------------------------------------


def _can_shape() -> str | None:
    try:
        netns.check_available()
    except UserError as e:
        return str(e)
    return None


needs_root = pytest.mark.skipif(_can_shape() is not None, reason=str(_can_shape()))


def _leftovers() -> list[str]:
    """Namespaces of these tests and of run_shaped (default prefix) made by this process: the
    other test worker may be building its own right now (this once counted every ``qbtest``
    namespace, and CI failed three times on the other worker's live network)."""
    mine = (f"{PREFIX}-{os.getpid()}-", f"qb-{os.getpid()}-")
    return [n for n in netns.list_namespaces() if n.startswith(mine)]


def _allreduce(backend: str, rate: float, mib: float, tmp: Path, *extra: str) -> tuple:
    out = tmp / f"{backend}-{rate:g}.json"
    program = [sys.executable, PROG, backend, str(mib), "2", str(out), *extra]
    status = shaped.run_program(backend, _star(2, rate), program, tmp, timeout=120, prefix=PREFIX)
    result = json.loads(out.read_text()) if out.exists() else None
    return status, result


@pytest.fixture
def no_leftovers(capfd: pytest.CaptureFixture[str]):
    """Fails when a test leaves namespaces, in one line naming them and what teardown said (a CI
    log keeps only the short summary)."""
    yield
    left = _leftovers()
    if left:
        said = [line for line in capfd.readouterr().err.splitlines() if "namespace" in line]
        pytest.fail(f"left {left}; teardown said: {' | '.join(said) or 'nothing'}")


@pytest.mark.slow
@needs_root
@pytest.mark.parametrize("backend", ["gloo", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_shaped_allreduce_is_limited_by_the_link(
    backend: str, tmp_path: Path, no_leftovers: None
) -> None:
    if backend == "mpi":
        local.find_mpirun()
    status, shaped_run = _allreduce(backend, 100e6, 16, tmp_path)
    assert status == ("ok", 0), (tmp_path / "stderr.log").read_text()[-3000:]
    # 16 MiB at 100 Mbit/s takes >= 1.3 s per allreduce; generous bounds for a busy machine.
    assert 0.02 < shaped_run["busbw_gbit_s"] < 0.105
    out = tmp_path / "unshaped.json"
    launch(backend, 2, [PROG, backend, "16", "2", str(out)])
    unshaped = json.loads(out.read_text())
    assert min(shaped_run["times_s"]) > 3 * min(unshaped["times_s"])


@pytest.mark.slow
@needs_root
@pytest.mark.parametrize("backend", ["gloo", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_a_failing_rank_fails_the_run_fast_and_cleans_up(
    backend: str, tmp_path: Path, no_leftovers: None
) -> None:
    t0 = time.monotonic()
    status, _ = _allreduce(backend, 1e9, 1, tmp_path, "1")
    assert status[0] == "failed" and status[1] != 0
    assert time.monotonic() - t0 < 60  # the surviving rank was killed, not left waiting


@pytest.mark.slow
@needs_root
def test_timeout_and_interrupt_clean_up(tmp_path: Path, no_leftovers: None) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    status = shaped.run_program("gloo", _star(2, 1e9), sleeper, tmp_path, timeout=1, prefix=PREFIX)
    assert status == ("timeout", None)
    with (
        pytest.raises(KeyboardInterrupt),
        netns.shaped_network(_star(2, 1e9), prefix=PREFIX) as net,
    ):
        assert set(net.namespaces) <= set(netns.list_namespaces())
        raise KeyboardInterrupt


@pytest.mark.slow
@needs_root
def test_stale_sweep_removes_only_dead_owners(no_leftovers: None) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"{PREFIX}-{dead.pid}-0-hub", f"{PREFIX}-{os.getpid()}-999-hub"
    for ns in (stale, live):
        netns.run(netns.netns_add(ns))
    try:
        assert netns.cleanup_stale(PREFIX) == [stale]
        assert _leftovers() == [live] and stale not in netns.list_namespaces()
    finally:
        netns.delete_namespace(live)


@pytest.mark.slow
@needs_root
def test_run_shaped_runs_the_worker(tmp_path: Path, no_leftovers: None) -> None:
    spec = RunSpec.from_dict({
        "scenario": "t", "model": "mlp", "dataset": "synthetic", "world_size": 2,
        "backend": "gloo", "scheme": "allreduce", "compressor": {"name": "none"},
        "batch_size": 8, "warmup": 1, "iterations": 2, "lr": 0.01, "momentum": 0.0, "seed": 0,
        "timeout": 120, "network": {"bandwidth": "1gbit"},
    })  # fmt: skip
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    status = shaped.run_shaped(spec, spec_path, tmp_path, spec.measurement.timeout)
    assert status == ("ok", 0), (tmp_path / "stderr.log").read_text()[-3000:]
    assert sorted(p.name for p in (tmp_path / "parts").glob("rank-*.parquet")) == [
        "rank-0.parquet",
        "rank-1.parquet",
    ]


def _p2p(
    topo: network.Topology, tmp: Path, cluster: bool = False, backend: str = "gloo"
) -> dict[str, float]:
    out = tmp / "p2p.json"
    program = [sys.executable, here("netns_p2p_prog.py"), backend, "4", "3", str(out)]
    status = shaped.run_program(
        backend, topo, program, tmp, timeout=120, prefix=PREFIX, cluster=cluster
    )
    assert status == ("ok", 0), (tmp / "stderr.log").read_text()[-3000:]
    rates: dict[str, float] = json.loads(out.read_text())["gbit_s"]
    print(f"{topo}: Gbit/s from rank 0 to rank {rates}")  # docs/network.md quotes these (-s)
    return rates


def _assert_node_mate_off_the_link(rates: dict[str, float]) -> None:
    """Rank 0 to ranks 2 and 3 (the other node) at the 100 Mbit/s link's rate (2-105 %), to
    rank 1 (its node-mate) at least 10x faster."""
    assert 0.02 < rates["2"] < 0.105 and 0.02 < rates["3"] < 0.105, rates
    assert rates["1"] > 10 * max(rates["2"], rates["3"]), rates


@pytest.mark.slow
@needs_root
def test_traffic_inside_a_node_never_crosses_the_link_between_nodes(
    tmp_path: Path, no_leftovers: None
) -> None:
    """2 nodes x 2 ranks at 100 Mbit/s between them: rank 0 -> 1 stays on node 0's loopback,
    rank 0 -> 2 and 0 -> 3 cross the link. Then the loopback shaped at 100 Mbit/s and the link
    left free: the other way round."""
    _assert_node_mate_off_the_link(
        _p2p(network.Topology(2, 2, inter=network.at_rate(100e6)), tmp_path)
    )
    inside = _p2p(network.Topology(2, 2, intra=network.at_rate(100e6)), tmp_path)
    assert 0.02 < inside["1"] < 0.105, inside
    assert min(inside["2"], inside["3"]) > 10 * inside["1"], inside


@pytest.mark.slow
@needs_root
@pytest.mark.parametrize("backend", ["gloo", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_a_cluster_launch_keeps_a_nodes_ranks_together(
    backend: str, tmp_path: Path, no_leftovers: None
) -> None:
    """gloo: one torchrun per node, c10d rendezvous at node 0; mpi: mpirun with a hostfile and
    the namespace agent. Rank 0's node-mate (rank 1) is on its loopback or shared memory, ranks
    2 and 3 behind the 100 Mbit/s link, whatever order the nodes joined in."""
    topo = network.Topology(2, 2, inter=network.at_rate(100e6))
    _assert_node_mate_off_the_link(_p2p(topo, tmp_path, cluster=True, backend=backend))
