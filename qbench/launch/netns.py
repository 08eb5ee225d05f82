"""Emulated links: one network namespace per rank, joined by a bridge, every link shaped by tbf.

For world size K and a namespace stem ``<prefix>-<pid>-<seq>`` (the pid of the process that made
it, so a stale-namespace sweep can tell leftovers of dead processes from a live sweep's)::

    <stem>-hub   bridge br0, 10.213.1.254/24, ports p0 .. p<K-1>
    <stem>-r<r>  eth0 = 10.213.1.<r+1>/24, the veth peer of hub port p<r>

tbf sits on eth0 (rank r's upload) and on hub port p<r> (its download): every rank has a
full-duplex link of the given rate to an ideal switch, like one NIC per node. No namespace has a
route out, so traffic can reach the addresses above and nothing else. Interface names only need
to be unique inside their namespace, so concurrent networks never collide.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from qbench.errors import UserError
from qbench.launch import procs
from qbench.spec import network

SUBNET = "10.213.1"
HUB_HOST = 254
MAX_RANKS = HUB_HOST - 1
BRIDGE = "br0"
RANK_IF = "eth0"
CMD_TIMEOUT_S = 30.0
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
    world_size: int
    tbf: Tbf

    @property
    def hub(self) -> str:
        return f"{self.stem}-hub"

    def rank_ns(self, rank: int) -> str:
        return f"{self.stem}-r{rank}"

    def rank_addr(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    @property
    def hub_addr(self) -> str:
        return f"{SUBNET}.{HUB_HOST}"

    @property
    def subnet(self) -> str:
        return f"{SUBNET}.0/24"

    @property
    def namespaces(self) -> list[str]:
        return [self.hub, *(self.rank_ns(r) for r in range(self.world_size))]


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


def tbf_add(ns: str, dev: str, tbf: Tbf) -> list[str]:
    return ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
            "rate", f"{tbf.rate_bits}bit", "burst", str(tbf.burst_bytes),
            "latency", f"{tbf.latency_ms}ms"]  # fmt: skip


def setup_commands(net: ShapedNetwork) -> list[list[str]]:
    """Every command that builds ``net``, in order."""
    hub = net.hub
    cmds = [netns_add(hub), link_up(hub, "lo"), bridge_add(hub, BRIDGE),
            addr_add(hub, BRIDGE, f"{net.hub_addr}/24"), link_up(hub, BRIDGE)]  # fmt: skip
    for r in range(net.world_size):
        ns, port = net.rank_ns(r), f"p{r}"
        cmds += [
            netns_add(ns), link_up(ns, "lo"), veth_add(hub, port, RANK_IF, ns),
            set_master(hub, port, BRIDGE), addr_add(ns, RANK_IF, f"{net.rank_addr(r)}/24"),
            tbf_add(ns, RANK_IF, net.tbf), tbf_add(hub, port, net.tbf),
            link_up(hub, port), link_up(ns, RANK_IF),
        ]  # fmt: skip
    return cmds


def stale_namespaces(names: list[str], prefix: str, alive: Callable[[int], bool]) -> list[str]:
    """Names made by ``prefix`` networks whose creating process is gone."""
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-\d+-(?:hub|r\d+)$")
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


def teardown(net: ShapedNetwork) -> None:
    """Delete every namespace of ``net`` that exists; warn (never raise) about any left."""
    try:
        present = set(list_namespaces())
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        present = set(net.namespaces)
    for ns in net.namespaces:
        if ns not in present:
            continue
        try:
            delete_namespace(ns)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            print(f"qbench: could not delete network namespace {ns}: {e}", file=sys.stderr)


@contextlib.contextmanager
def shaped_network(
    world_size: int, bandwidth_bits_per_s: float, prefix: str = "qb"
) -> Iterator[ShapedNetwork]:
    """Build the emulated network, yield its names, and always delete it again.

    Also deleted on exceptions, Ctrl-C and SIGTERM (turned into KeyboardInterrupt here when no
    other handler is set); after a SIGKILL, the next call's stale sweep removes the leftovers.
    """
    check_available()
    if not 1 <= world_size <= MAX_RANKS:
        raise UserError(
            f"network.bandwidth supports 1..{MAX_RANKS} ranks, got world_size {world_size}"
        )
    cleanup_stale(prefix)
    stem = f"{prefix}-{os.getpid()}-{next(_seq)}"
    net = ShapedNetwork(stem=stem, world_size=world_size, tbf=tbf_for(bandwidth_bits_per_s))
    with procs.sigterm_as_interrupt():
        try:
            _build(net)
            yield net
        finally:
            teardown(net)


def _build(net: ShapedNetwork) -> None:
    for argv in setup_commands(net):
        try:
            run(argv)
        except RuntimeError as e:
            raise UserError(
                f"network.bandwidth could not build the emulated network: {e}; it needs "
                "CAP_NET_ADMIN and the veth, bridge and tbf kernel modules, or remove `network:`"
            ) from e
