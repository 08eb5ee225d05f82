"""A declared cluster: the few facts a user knows about a machine, read from a small YAML file
(scenarios/projection/clusters/*.yaml, documented in docs/projection.md).

* ``nodes`` and ``devices_per_node`` (or ``devices`` in all, which must divide among the nodes);
* ``device``: its ``compute`` per workload (a measured ``{samples_per_s, batch}``, or a replay
  ``{timeline: FILE, batch}``), or ``flops_per_s`` with an ``efficiency`` for workloads that
  state their FLOPs per sample; its ``codec``: stated ``{encode, decode}`` rates in elements/s
  with a ``launch`` cost per tensor and call, or ``{kernels: FILE}``, a ``qbench bench kernels
  --json`` document of that device;
* ``collective``: ``mpi-host`` (MPI reduce-and-broadcast through host memory, seed 002's),
  ``nccl-ring`` or ``nccl-tree``;
* the links: ``host`` for ``mpi-host`` (its ``stage``, ``bus``, ``latency`` and ``fixed``
  values, or ``calibrated``: fitted on the cells named by ``calibration``), ``intra`` and
  ``inter`` ``{rate, latency}`` for NCCL;
* ``band``: the error band measured by validating the model (``qbench project --against``);
  without one a projection says it has none.

Every mistake is one line naming the field and a fix (``UserError``, exit 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qbench.cluster import units
from qbench.errors import UserError, choice_error

COLLECTIVES = ("mpi-host", "nccl-ring", "nccl-tree")
_TOP = ("cluster", "nodes", "devices_per_node", "devices", "device", "collective", "host",
        "intra", "inter", "calibration", "band", "double_buffering")  # fmt: skip
HOST_KEYS = ("stage", "bus", "latency", "fixed")


@dataclass(frozen=True)
class Link:
    """A link's rate (bytes/s, one direction, per device unless said) and per-message latency."""

    rate: float
    latency: float


@dataclass(frozen=True)
class Host:
    """MPI reduce-and-broadcast through host memory (seed 002 §2.4.1, §3.3): each device
    stages its payload to the host and back (``stage``, bytes/s per device), the ranks' range
    exchange moves 2 (K-1) payloads through the host's shared memory bus (``bus``, bytes/s in
    all), each of the K-1 peer steps costs ``latency`` and an exchange ``fixed`` seconds."""

    stage: float
    bus: float
    latency: float
    fixed: float


@dataclass(frozen=True)
class Compute:
    """One workload's compute on the device: ``seconds`` for one iteration of ``batch``
    samples, taken as linear in the batch (the model's assumption; seed 002's VGG19 at 16
    samples per GPU is one place where it fails)."""

    seconds: float
    batch: int
    source: str

    def at(self, batch: float) -> float:
        return self.seconds * batch / self.batch


@dataclass(frozen=True)
class Codec:
    """The device's codec speed: stated rates (elements/s) and a cost per kernel launch, or a
    ``bench kernels`` document (``kernels``: its path)."""

    encode: float = 0.0
    decode: float = 0.0
    launch: float = 0.0
    kernels: str = ""


@dataclass(frozen=True)
class Device:
    name: str
    compute: Mapping[str, Compute] = field(default_factory=dict)
    flops_per_s: float = 0.0
    efficiency: float = 0.0
    codec: Codec | None = None


@dataclass(frozen=True)
class Calibration:
    """The measured cells the host values are fitted on: a CSV of ``network``, ``gpus``,
    ``method`` (a compressor label) and ``samples_per_s``, and which of its rows (``use``)."""

    cells: str
    use: Mapping[str, Any]


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: int
    devices_per_node: int
    device: Device
    collective: str
    host: Host | None = None
    intra: Link | None = None
    inter: Link | None = None
    calibration: Calibration | None = None
    band: str = ""
    double_buffering: bool = False
    """Codec and transfers overlap (seed 002 §3.3, CNTK's MPI path): while some gradients are
    quantized, those already quantized are sent."""
    source: str = ""

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node


def load(path: str | Path) -> Cluster:
    """The cluster file at ``path`` (relative paths inside it are taken from its folder)."""
    p = Path(path)
    doc = units.read_yaml(p, "cluster file", "scenarios/projection/clusters/aws-p2-k80.yaml")
    return parse(doc, p.parent, str(p))


def parse(doc: Any, base: Path, source: str = "<cluster>") -> Cluster:
    """Check a cluster document and build its :class:`Cluster` (one UserError per mistake)."""
    doc = units.mapping(doc, "cluster file", "`cluster: my-machine`")
    unknown = sorted(set(doc) - set(_TOP))
    if unknown:
        raise choice_error("cluster key", unknown[0], list(_TOP))
    nodes, per_node = _shape(doc)
    collective = doc.get("collective")
    if collective not in COLLECTIVES:
        if collective is None:
            raise UserError(f"collective is missing; give one of {', '.join(COLLECTIVES)}")
        raise choice_error("collective", collective, list(COLLECTIVES))
    calibration = _calibration(doc.get("calibration"), base)
    host = _host(doc.get("host"), calibration) if collective == "mpi-host" else None
    intra = _link(doc, "intra") if collective != "mpi-host" and per_node > 1 else None
    inter = _link(doc, "inter") if collective != "mpi-host" and nodes > 1 else None
    band = str(base / doc["band"]) if doc.get("band") else ""
    return Cluster(name=str(doc.get("cluster") or Path(source).stem), nodes=nodes,
                   devices_per_node=per_node, device=_device(doc.get("device"), base),
                   collective=collective, host=host, intra=intra, inter=inter,
                   calibration=calibration, band=band,
                   double_buffering=_flag(doc.get("double_buffering", False), "double_buffering"),
                   source=source)  # fmt: skip


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{key} must be true or false, got {value!r}")
    return value


def _shape(doc: dict[str, Any]) -> tuple[int, int]:
    nodes = units.count(doc.get("nodes", 1), "nodes")
    if "devices_per_node" in doc:
        return nodes, units.count(doc["devices_per_node"], "devices_per_node")
    if "devices" not in doc:
        raise UserError("devices_per_node is missing; e.g. `devices_per_node: 8`")
    devices = units.count(doc["devices"], "devices")
    if devices % nodes:
        raise UserError(f"devices: {devices} do not divide among {nodes} nodes; give a multiple "
                        f"of {nodes} or `devices_per_node` instead")  # fmt: skip
    return nodes, devices // nodes


def _host(value: Any, calibration: Calibration | None) -> Host | None:
    """None when the values are to be fitted (``host: calibrated``)."""
    if value == "calibrated":
        if calibration is None:
            raise UserError("host: calibrated needs a `calibration: {cells: FILE, use: "
                            "{method: fp32}}` naming the cells to fit on")  # fmt: skip
        return None
    host = units.mapping(value, "host", "`host: {stage: 40gbit, bus: 60gbit, latency: 5ms, "
                    "fixed: 10ms}` or `host: calibrated`")  # fmt: skip
    missing = [k for k in HOST_KEYS if k not in host]
    if missing or set(host) - set(HOST_KEYS):
        bad = missing[0] if missing else sorted(set(host) - set(HOST_KEYS))[0]
        raise UserError(f"host.{bad}: {'missing' if missing else 'unknown'}; host takes "
                        f"{', '.join(HOST_KEYS)}, or write `host: calibrated`")  # fmt: skip
    return Host(stage=units.bytes_per_s(host["stage"], "host.stage"),
                bus=units.bytes_per_s(host["bus"], "host.bus"),
                latency=units.seconds(host["latency"], "host.latency"),
                fixed=units.seconds(host["fixed"], "host.fixed"))  # fmt: skip


def _link(doc: dict[str, Any], key: str) -> Link:
    if key not in doc:
        where = "inside a node" if key == "intra" else "between nodes"
        raise UserError(f"{key} is missing: the link {where}; e.g. `{key}: "
                        "{rate: 400gbit, latency: 10us}`")  # fmt: skip
    link = units.mapping(doc[key], key, f"`{key}: {{rate: 400gbit, latency: 10us}}`")
    return Link(rate=units.bytes_per_s(link.get("rate"), f"{key}.rate"),
                latency=units.seconds(link.get("latency", 0), f"{key}.latency"))  # fmt: skip


def _calibration(value: Any, base: Path) -> Calibration | None:
    if value is None:
        return None
    example = "`calibration: {cells: FILE.csv, use: {method: fp32}}`"
    cal = units.mapping(value, "calibration", example)
    if not cal.get("cells"):
        raise UserError("calibration.cells is missing; give the CSV of measured cells")
    use = units.mapping(cal.get("use"), "calibration.use", "`use: {method: fp32}`")
    return Calibration(cells=str(base / cal["cells"]), use=use)


def _device(value: Any, base: Path) -> Device:
    dev = units.mapping(value, "device", "`device: {name: H100, compute: {...}}`")
    compute = {}
    for name, c in units.mapping(dev.get("compute", {}), "device.compute",
                            "`{resnet50: {samples_per_s: 47.2, batch: 32}}`").items():  # fmt: skip
        compute[str(name)] = _compute(c, f"device.compute.{name}", base)
    flops = dev.get("flops_per_s")
    if flops is not None:
        flops = units.positive(flops, "device.flops_per_s", "flops_per_s: 989e12")
        eff = units.positive(dev.get("efficiency"), "device.efficiency", "efficiency: 0.4")
        if eff > 1:
            raise UserError(f"device.efficiency must be at most 1 (a share of flops_per_s), "
                            f"got {eff}")  # fmt: skip
    codec = _codec(dev["codec"], base) if "codec" in dev else None
    return Device(name=str(dev.get("name", "device")), compute=compute,
                  flops_per_s=flops or 0.0, efficiency=eff if flops else 0.0,
                  codec=codec)  # fmt: skip


def _compute(value: Any, key: str, base: Path) -> Compute:
    example = "`{samples_per_s: 47.2, batch: 32}` or `{timeline: F, batch: 32}`"
    c = units.mapping(value, key, example)
    batch = units.count(c.get("batch"), f"{key}.batch")
    if "timeline" in c:
        return _timeline(base / str(c["timeline"]), batch, key)
    sps = units.positive(c.get("samples_per_s"), f"{key}.samples_per_s", "samples_per_s: 47.2")
    return Compute(seconds=batch / sps, batch=batch, source=f"{sps:g} samples/s at batch {batch}")


def _timeline(path: Path, batch: int, key: str) -> Compute:
    """A replay timeline (``timeline.json`` of a replayed run, ``qbench timeline``): its
    forward, backward and step seconds at ``batch``."""
    import json  # only for this form

    try:
        t = json.loads(path.read_text())
        seconds = float(t["forward_s"]) + float(t["backward_s"]) + float(t["step_s"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(
            f"{key}.timeline: {path} is not a replay timeline (forward_s, backward_s, step_s); "
            "make one with `qbench timeline`"
        ) from None
    return Compute(seconds=seconds, batch=batch, source=f"timeline {path.name} at batch {batch}")


def _codec(value: Any, base: Path) -> Codec:
    c = units.mapping(value, "device.codec", "`{encode: 2e10, decode: 2e10, launch: 5us}` or "
                 "`{kernels: kernels.json}`")  # fmt: skip
    if "kernels" in c:
        return Codec(kernels=str(base / str(c["kernels"])), launch=0.0)
    return Codec(encode=units.positive(c.get("encode"), "device.codec.encode", "encode: 2e10"),
                 decode=units.positive(c.get("decode"), "device.codec.decode", "decode: 2e10"),
                 launch=units.seconds(c.get("launch", 0), "device.codec.launch"))  # fmt: skip
