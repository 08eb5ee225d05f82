"""A real single-node Slurm cluster for the tests: munged + slurmctld + slurmd on localhost.

The session fixture :func:`slurm_cluster` writes a minimal slurm.conf into a temporary directory,
starts a munged of its own (own key, own socket: a system munged is left alone), slurmctld and
slurmd on free ports, waits until ``sinfo`` shows the node idle and exports SLURM_CONF to the
tests. At the end it cancels what is left in the queue and stops the daemons, also when a test
failed. The tests that need it skip only for a missing prerequisite, found before anything
starts: Debian's slurm-wlm and munge not installed (``make slurm``), or for emulated nodes not
root or no ``ip`` / ``tc``. Anything else is a real start-up error and fails them, naming it:
a daemon that exits (the supervisor says which, with what code) or nodes that are not idle in
time, with the last lines of every daemon's log and output.

The daemons run under a small supervisor (tests/slurm_supervisor.py), a child subreaper that
reaps the slurmstepds slurmd leaves and stops everything when asked or when a daemon exits.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import slurm_supervisor
from tests.slurm_supervisor import STOP_GRACE_S

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "salloc", "scancel", "squeue", "sinfo")
START_TIMEOUT_S = 60.0
NODE = "localhost"


@dataclass
class Cluster:
    root: Path
    conf: Path
    cpus: int

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with this cluster's SLURM_CONF."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def log_tails(self, lines: int = 8) -> str:
        """The last lines of the supervisor's log (which daemon exited), each daemon's log and
        its own output (where a daemon that dies at start-up says why); empty ones left out."""
        out = []
        logs = ("supervisor.log", "munged.log", "slurmctld.log", "slurmd.log")
        outputs = sorted(p.name for p in self.root.glob("*.out"))
        for name in (*logs, *outputs, *sorted(p.name for p in self.root.glob("slurmd-*.log"))):
            path = self.root / name
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
                if tail:
                    out.append(f"{name}: " + " | ".join(tail))
        return "; ".join(out) or "no logs"


def binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d) / name).exists()), None
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memory_mb() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 1024


def slurm_conf(
    root: Path, user: str, cpus: int, memory: int, nodes: dict[str, str] | None = None,
    controller: str = NODE,
) -> str:  # fmt: skip
    """A minimal configuration: everything in ``root``, no accounting, no cgroups; one node
    (localhost) or ``nodes`` (name -> address), whose slurmds keep per-node files (``%n``)."""
    nodes = nodes or {NODE: "127.0.0.1"}
    names = ",".join(nodes)
    per_node = "" if list(nodes) == [NODE] else "-%n"
    return "\n".join([
        "ClusterName=qbench-test",
        f"SlurmctldHost={controller}",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge.sock'}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / ('spool' + per_node)}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / f'slurmd{per_node}.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / f'slurmd{per_node}.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=300",
        *(f"NodeName={name} NodeAddr={addr} CPUs={cpus} RealMemory={memory} State=UNKNOWN"
          for name, addr in nodes.items()),
        f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])  # fmt: skip


def daemon_commands(root: Path, slurmds: list[list[str]] | None = None) -> list[list[str]]:
    """Each in the foreground, so that the supervisor is their parent; ``slurmds``: the slurmd
    commands of emulated nodes (default: one on localhost)."""
    munged, slurmctld, slurmd = (binary(d) or d for d in DAEMONS)
    return [
        [munged, "--foreground", f"--key-file={root / 'munge.key'}",
         f"--socket={root / 'munge.sock'}", f"--log-file={root / 'munged.log'}",
         f"--pid-file={root / 'munged.pid'}", f"--seed-file={root / 'munged.seed'}"],
        [slurmctld, "-D", "-i"],
        *(slurmds or [[slurmd, "-D", "-N", NODE]]),
    ]  # fmt: skip


def _sinfo_state(env: dict[str, str]) -> str:
    try:
        p = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format", "%N %t"],
            capture_output=True, text=True, timeout=10, env=env,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return p.stdout.strip()


@contextlib.contextmanager
def running_cluster() -> Iterator[Cluster]:
    """Start the daemons; yield once the node is idle; always stop them. pytest.skip when they
    are not installed, pytest.fail (naming the cause) when they do not come up. Exports
    SLURM_CONF while it runs."""
    _check_installed()
    root = _new_root()
    cluster = Cluster(root, root / "slurm.conf", os.cpu_count() or 1)
    cluster.conf.write_text(
        slurm_conf(root, getpass.getuser(), cluster.cpus, max(memory_mb() // 2, 256))
    )
    (root / "daemons.json").write_text(json.dumps(daemon_commands(root)))
    previous = os.environ.get("SLURM_CONF")
    try:
        with _supervised(cluster, [NODE]):
            os.environ["SLURM_CONF"] = str(cluster.conf)
            yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@contextlib.contextmanager
def running_nodes_cluster(nodes: int) -> Iterator[Cluster]:
    """A Slurm cluster of ``nodes`` emulated hosts (qbench.launch.netns): one slurmd per node in
    its network namespace with a hostname of its own (``qbnode<k>``, a UTS namespace; NodeAddr its
    address; per-node spool, pid and log files) and slurmctld on this host, which a veth into the
    emulated bridge (10.213.1.253) joins to the nodes. Each node's /etc/hosts (a bind mount in a
    mount namespace of its own) names every node, as a cluster's DNS would. SLURM_CONF is not
    exported (a single-node cluster may run beside it): pass ``cluster.env``. Needs root."""
    from qbench.errors import UserError
    from qbench.launch import netns
    from qbench.spec import network

    _check_installed()
    try:
        netns.check_available()
    except UserError as e:  # a missing prerequisite (not root, no ip / tc); nothing else is
        pytest.skip(f"emulated Slurm nodes need network namespaces: {e}")
    root = _new_root()
    names = {f"qbnode{k}": f"{netns.SUBNET}.{k + 1}" for k in range(nodes)}
    cluster = Cluster(root, root / "slurm.conf", 2)
    cluster.conf.write_text(slurm_conf(
        root, getpass.getuser(), cluster.cpus, max(memory_mb() // (2 * nodes), 256), names,
        controller=f"{NODE}({HOST_ADDR})",
    ))  # fmt: skip
    for name in names:
        (root / f"spool-{name}").mkdir()
    hosts = root / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in names.items()))
    slurmd = binary("slurmd") or "slurmd"
    with (
        netns.shaped_network(network.Topology(nodes, 1), prefix="qbslurm") as net,
        _host_link(net),
    ):
        # nsenter, not `ip netns exec`: that remounts /sys without the cgroup mounts slurmd needs
        slurmds = [
            [binary("nsenter") or "nsenter", f"--net=/run/netns/{net.node_ns(k)}", "--",
             binary("unshare") or "unshare", "--uts", "--mount", "sh", "-c",
             f"mount --bind {hosts} /etc/hosts && hostname {name} && exec {slurmd} -D -N {name}"]
            for k, name in enumerate(names)
        ]  # fmt: skip
        (root / "daemons.json").write_text(json.dumps(daemon_commands(root, slurmds)))
        with _supervised(cluster, list(names)):
            yield cluster


HOST_ADDR = "10.213.1.253"


@contextlib.contextmanager
def _host_link(net: object) -> Iterator[None]:
    """A veth from this host into the emulated bridge, so that slurmctld and the clients here
    reach the nodes' slurmds and they reach it (deleting the hub namespace removes it)."""
    from qbench.launch import netns

    hub = net.hub  # type: ignore[attr-defined]
    name = f"qbh{os.getpid() % 100000}"
    for argv in (
        ["ip", "link", "add", name, "type", "veth", "peer", "name", "ph", "netns", hub],
        netns.set_master(hub, "ph", netns.BRIDGE),
        netns.link_up(hub, "ph"),
        ["ip", "addr", "add", f"{HOST_ADDR}/24", "dev", name],
        ["ip", "link", "set", name, "up"],
    ):
        netns.run(argv)
    try:
        yield
    finally:
        with contextlib.suppress(RuntimeError):
            netns.run(["ip", "link", "delete", name])


def _check_installed() -> None:
    missing = [d for d in (*DAEMONS, *CLIENTS) if binary(d) is None]
    if missing:
        pytest.skip(f"slurm-wlm not installed: run `make slurm` (missing {', '.join(missing)})")


def _new_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="qbench-slurm-"))
    root.chmod(0o755)  # munged wants its socket directory searchable by all
    for d in ("state", "spool"):
        (root / d).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    return root


@contextlib.contextmanager
def _supervised(cluster: Cluster, nodes: list[str]) -> Iterator[None]:
    """Run the daemons of ``cluster.root``/daemons.json under the supervisor until every node
    is idle; always stop them and remove the directory."""
    root, env = cluster.root, cluster.env
    log = open(root / "supervisor.log", "wb")  # noqa: SIM115 (closed below)
    supervisor = subprocess.Popen(
        [sys.executable, slurm_supervisor.__file__, str(root)], env=env, stdout=log, stderr=log,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(f"{n} idle" in _sinfo_state(env) for n in nodes):
            if supervisor.poll() is not None or time.monotonic() > deadline:
                pytest.fail(start_failure(cluster, supervisor.poll()), pytrace=False)
            time.sleep(0.5)
        yield
    finally:
        _cancel_jobs(env)
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=STOP_GRACE_S * 3)
        except subprocess.TimeoutExpired:
            supervisor.kill()
            supervisor.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def start_failure(cluster: Cluster, supervisor_exit: int | None) -> str:
    """Why the daemons did not come up, for the tests to fail with: the prerequisites were
    there (their absence skips before anything starts), so this is a real start-up error."""
    if supervisor_exit is None:
        why = f"the nodes were not idle after {START_TIMEOUT_S:g} s"
    else:
        why = f"the supervisor stopped them (exit code {supervisor_exit})"
    return f"slurm daemons did not start: {why}; {cluster.log_tails()}"


def _cancel_jobs(env: dict[str, str]) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        p = subprocess.run(
            ["squeue", "--noheader", "--format", "%i"], capture_output=True, text=True,
            timeout=10, env=env,
        )  # fmt: skip
        jobs = p.stdout.split()
        if jobs:
            subprocess.run(["scancel", *jobs], capture_output=True, timeout=10, env=env)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    with running_cluster() as cluster:
        yield cluster
