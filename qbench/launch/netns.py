"""Emulated hosts and links: one network namespace per node, joined by a bridge; the links
between nodes (and, optionally, each node's loopback) shaped by tbf.

For N nodes of G ranks each (``spec.network.Topology``; the flat star of ``bandwidth`` is N
nodes of one rank) and a namespace stem ``<prefix>-<pid>-<seq>`` (the pid of the process that
made it, so a stale-namespace sweep can tell leftovers of dead processes from a live sweep's)::

    <stem>-hub   bridge br0, 10.213.1.254/24, ports p0 .. p<N-1>
    <stem>-n<n>  eth0 = 10.213.1.<n+1>/24, the veth peer of hub port p<n>; ranks nG .. nG+G-1

tbf sits on eth0 (node n's upload) and on hub port p<n> (its download): every node has a
full-duplex link of the inter-node rate to an ideal switch, like one NIC per node. The ranks of
a node share its namespace: traffic between them goes to the node's own address, which Linux
routes over loopback, so it never crosses eth0's shaper; an ``intra`` rate puts a tbf on lo,
which then carries all of the node's internal traffic at that rate together (a shared bus, not
a link per pair). No namespace has a route out, so traffic can reach the addresses above and
nothing else. Interface names only need to be unique inside their namespace, so concurrent
networks never collide.

Every ``ip``/``tc`` command comes from a pure argv builder below; :func:`run` executes one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from qbench.errors import UserError
from qbench.launch import procs
from qbench.spec import network

SUBNET = "10.213.1"
HUB_HOST = 254
MAX_RANKS = HUB_HOST - 1
BRIDGE = "br0"
RANK_IF = "eth0"
CMD_TIMEOUT_S = 30.0
LO_SHAPED_MTU = 1500
_SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
_seq = itertools.count()


@dataclass(frozen=True, kw_only=True)
class Tbf:
    """tbf parameters of one link direction (see :func:`tbf_for` for the choice)."""

    rate_bits: int
    burst_bytes: int
    latency_ms: int


def tbf_for(rate_bits_per_s: float) -> Tbf:
    """burst = 2 ms of traffic at the rate, at least 16 KiB; queue bound (latency) = 50 ms.

    burst: tbf refills its bucket from a timer; a bucket smaller than what arrives between two
    wake-ups (about 1 ms with HZ=1000, more on a busy machine) caps the link below its rate, so
    2 ms of traffic (250 kB at 1 Gbit/s) keeps it at the rate; the 16 KiB floor (> 10 full
    frames) keeps low rates from stalling on single frames. Measured allreduce busbw, 2 gloo
    ranks: 0.956 Gbit/s at 1gbit, 0.089 at 100mbit, 0.008 at 10mbit (tbf counts Ethernet
    frames, so TCP/IP headers take ~5 % of the rate).
    latency: how long a packet may wait in the tbf queue before it is dropped. 50 ms holds a
    whole TCP window at these rates, so the shaper delays instead of dropping and throughput is
    not spoiled by retransmission timeouts; short messages queued behind a bulk transfer wait
    up to that long, as on a congested real link.
    """
    rate = int(rate_bits_per_s)
    return Tbf(rate_bits=rate, burst_bytes=network.tbf_burst_bytes(rate), latency_ms=50)


@dataclass(frozen=True, kw_only=True)
class ShapedNetwork:
    """Names and addresses of one emulated network (all pure; :func:`shaped_network` builds it)."""

    stem: str
    """``<prefix>-<pid>-<seq>``; every namespace name starts with it."""
    nodes: int
    ranks_per_node: int = 1
    tbf: Tbf | None
    """Between nodes (None: unshaped veth)."""
    intra_tbf: Tbf | None = None
    """On each node's loopback (None: unshaped)."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def hub(self) -> str:
        return f"{self.stem}-hub"

    def node_ns(self, node: int) -> str:
        return f"{self.stem}-n{node}"

    def node_addr(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def rank_ns(self, rank: int) -> str:
        return self.node_ns(rank // self.ranks_per_node)

    def rank_addr(self, rank: int) -> str:
        return self.node_addr(rank // self.ranks_per_node)

    @property
    def hub_addr(self) -> str:
        return f"{SUBNET}.{HUB_HOST}"

    @property
    def subnet(self) -> str:
        return f"{SUBNET}.0/24"

    @property
    def namespaces(self) -> list[str]:
        return [self.hub, *(self.node_ns(n) for n in range(self.nodes))]


# ---- argv builders (pure) ------------------------------------------------------------------


def netns_add(ns: str) -> list[str]:
    return ["ip", "netns", "add", ns]


def netns_delete(ns: str) -> list[str]:
    return ["ip", "netns", "delete", ns]


def netns_list() -> list[str]:
    return ["ip", "-json", "netns", "list"]


def netns_pids(ns: str) -> list[str]:
    return ["ip", "netns", "pids", ns]


def netns_exec(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def bridge_add(ns: str, name: str) -> list[str]:
    return ["ip", "-n", ns, "link", "add", name, "type", "bridge"]


def veth_add(ns: str, name: str, peer: str, peer_ns: str) -> list[str]:
    """A veth pair created in ``ns`` whose ``peer`` end lands directly in ``peer_ns``."""
    return ["ip", "-n", ns, "link", "add", name, "type", "veth", "peer", "name", peer,
            "netns", peer_ns]  # fmt: skip


def set_master(ns: str, dev: str, master: str) -> list[str]:
    return ["ip", "-n", ns, "link", "set", dev, "master", master]


def addr_add(ns: str, dev: str, cidr: str) -> list[str]:
    return ["ip", "-n", ns, "addr", "add", cidr, "dev", dev]


def link_up(ns: str, dev: str) -> list[str]:
    return ["ip", "-n", ns, "link", "set", dev, "up"]


def set_mtu(ns: str, dev: str, mtu: int) -> list[str]:
    return ["ip", "-n", ns, "link", "set", dev, "mtu", str(mtu)]


def tbf_add(ns: str, dev: str, tbf: Tbf) -> list[str]:
    return ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
            "rate", f"{tbf.rate_bits}bit", "burst", str(tbf.burst_bytes),
            "latency", f"{tbf.latency_ms}ms"]  # fmt: skip


def setup_commands(net: ShapedNetwork) -> list[list[str]]:
    """Every command that builds ``net``, in order."""
    hub = net.hub
    cmds = [netns_add(hub), link_up(hub, "lo"), bridge_add(hub, BRIDGE),
            addr_add(hub, BRIDGE, f"{net.hub_addr}/24"), link_up(hub, BRIDGE)]  # fmt: skip
    for n in range(net.nodes):
        ns, port = net.node_ns(n), f"p{n}"
        cmds += [
            netns_add(ns), link_up(ns, "lo"), veth_add(hub, port, RANK_IF, ns),
            set_master(hub, port, BRIDGE), addr_add(ns, RANK_IF, f"{net.node_addr(n)}/24"),
        ]  # fmt: skip
        if net.tbf is not None:
            cmds += [tbf_add(ns, RANK_IF, net.tbf), tbf_add(hub, port, net.tbf)]
        if net.intra_tbf is not None:
            # loopback's 64 KiB MTU is larger than the bucket at low rates, and tbf drops a
            # packet larger than its bucket forever (TCP stalls): an Ethernet MTU, as on a NIC
            cmds += [set_mtu(ns, "lo", LO_SHAPED_MTU), tbf_add(ns, "lo", net.intra_tbf)]
        cmds += [link_up(hub, port), link_up(ns, RANK_IF)]
    return cmds


def stale_namespaces(names: list[str], prefix: str, alive: Callable[[int], bool]) -> list[str]:
    """Names made by ``prefix`` networks whose creating process is gone."""
    # r<k>: a rank's namespace, as networks were named before nodes held several ranks
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-\d+-(?:hub|[nr]\d+)$")
    return [n for n in names if (m := pattern.match(n)) and not alive(int(m.group(1)))]


# ---- running -------------------------------------------------------------------------------


def tool(name: str) -> str:
    """Absolute path of ``ip`` / ``tc`` (also from sbin when PATH lacks it)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    found = shutil.which(name, path=path)
    if not found:
        raise UserError(
            f"network.bandwidth needs the `{name}` command (iproute2), not found; "
            "install it (`apt-get install iproute2`) or remove `network:`"
        )
    return found


def check_available() -> None:
    """Fail before any run starts when emulated links cannot be built here."""
    if os.geteuid() != 0:
        raise UserError(
            "network.bandwidth needs root (network namespaces and tc); "
            "run as root or remove `network:`"
        )
    tool("ip")
    tool("tc")


def run(argv: list[str]) -> str:
    """Run one ``ip``/``tc`` command; its stdout, or RuntimeError naming it and its error."""
    proc = subprocess.run(
        [tool(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=CMD_TIMEOUT_S
    )
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise RuntimeError(f"`{' '.join(argv)}` failed: {msg}")
    return proc.stdout


def list_namespaces() -> list[str]:
    out = run(netns_list()).strip()
    return [str(e["name"]) for e in json.loads(out)] if out else []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def delete_namespace(ns: str) -> None:
    """Kill what still runs inside ``ns`` (ranks of a crashed run), then delete it."""
    with contextlib.suppress(RuntimeError):
        for pid in run(netns_pids(ns)).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    run(netns_delete(ns))


def cleanup_stale(prefix: str = "qb") -> list[str]:
    """Delete namespaces left by ``prefix`` networks of processes that died; returns them.

    Namespaces of live processes are kept: a second sweep on the same machine may be using them.
    """
    stale = stale_namespaces(list_namespaces(), prefix, _pid_alive)
    for ns in stale:
        with contextlib.suppress(RuntimeError):
            delete_namespace(ns)
    return stale


def teardown(net: ShapedNetwork, pauses: tuple[float, ...] = (0.2, 1.0, 4.0)) -> None:
    """Delete every namespace of ``net``; warn (never raise) about any still listed after.

    CI twice saw all three namespaces of a finished mpirun cluster launch survive teardown on a
    loaded machine, with no message kept. So the first round deletes every name without asking
    the listing first (a listing that missed them left them undeleted and unreported), gone
    means no longer listed (not a delete that exited 0), and what stays listed is deleted
    again after each pause. The warning says what the last delete said and what runs inside.
    """
    why: dict[str, str] = {}
    left = list(net.namespaces)
    for pause in (*pauses, None):
        for ns in left:
            why[ns] = _delete(ns)
        left = _present(left)
        if not left or pause is None:
            break
        time.sleep(pause)
    for ns in left:
        print(f"qbench: could not delete network namespace {ns}: {why[ns]}{_inside(ns)}",
              file=sys.stderr)  # fmt: skip


def _delete(ns: str) -> str:
    """Delete ``ns``; what went wrong, as the warning would say it."""
    try:
        delete_namespace(ns)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    return "still listed after `ip netns delete` exited 0"


def _inside(ns: str) -> str:
    """``; pids inside: ...`` naming what still runs in ``ns``; empty when none or unknown."""
    try:
        pids = run(netns_pids(ns)).split()
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return ""
    return f"; pids inside: {' '.join(_named(int(p)) for p in pids)}" if pids else ""


def _named(pid: int) -> str:
    try:
        return f"{pid} ({Path(f'/proc/{pid}/comm').read_text().strip()})"
    except OSError:
        return str(pid)


def _present(names: list[str]) -> list[str]:
    """Those of ``names`` that exist; all of them when the list cannot be read."""
    try:
        present = set(list_namespaces())
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return names
    return [ns for ns in names if ns in present]


@contextlib.contextmanager
def shaped_network(topo: network.Topology, prefix: str = "qb") -> Iterator[ShapedNetwork]:
    """Build the emulated nodes of ``topo``, yield their names, and always delete them again.

    Also deleted on exceptions, Ctrl-C and SIGTERM (turned into KeyboardInterrupt here when no
    other handler is set); after a SIGKILL, the next call's stale sweep removes the leftovers.
    """
    check_available()
    if not 1 <= topo.nodes <= MAX_RANKS:
        raise UserError(
            f"emulated networks hold 1..{MAX_RANKS} hosts, got {topo.nodes}; use fewer nodes "
            "(network.nodes) or, with network.bandwidth, fewer ranks"
        )
    cleanup_stale(prefix)
    net = ShapedNetwork(
        stem=f"{prefix}-{os.getpid()}-{next(_seq)}", nodes=topo.nodes,
        ranks_per_node=topo.ranks_per_node, tbf=_tbf(topo.inter), intra_tbf=_tbf(topo.intra),
    )  # fmt: skip
    with procs.sigterm_as_interrupt():
        try:
            _build(net)
            yield net
        finally:
            teardown(net)


def _tbf(link: network.Link) -> Tbf | None:
    return None if link.bits_per_s is None else tbf_for(link.bits_per_s)


def _build(net: ShapedNetwork) -> None:
    for argv in setup_commands(net):
        try:
            run(argv)
        except RuntimeError as e:
            raise UserError(
                f"network.bandwidth could not build the emulated network: {e}; it needs "
                "CAP_NET_ADMIN and the veth, bridge and tbf kernel modules, or remove `network:`"
            ) from e
