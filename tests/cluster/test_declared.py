"""Bad cluster and study descriptions are refused in one line naming the field and a fix, exit
2, before anything is projected (issue 46): a missing device speed, an unknown collective, a
non-positive rate, devices that do not divide among nodes, and the rest of the file's rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.invoke import qbench

GOOD = {
    "cluster": "c", "nodes": 2, "devices_per_node": 4, "collective": "nccl-ring",
    "intra": {"rate": "800gbit", "latency": "5us"}, "inter": {"rate": "100gbit", "latency": "10us"},
    "device": {"name": "g", "compute": {"w": {"samples_per_s": 100, "batch": 32}},
               "codec": {"encode": 1e10, "decode": 1e10, "launch": "5us"}},
}  # fmt: skip
STUDY = {"name": "s", "gpus": [1, 8],
         "workloads": [{"name": "w", "params": 1000000, "tensors": 4, "batch_per_gpu": 32}],
         "methods": ["none", {"name": "qsgd", "bits": 4}]}  # fmt: skip


def _run(tmp_path: Path, cluster: Any, study: Any = STUDY) -> tuple[int, str, str]:
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    r = qbench("project", str(tmp_path / "c.yaml"), str(tmp_path / "s.yaml"), "--format", "csv")
    return r.returncode, r.stdout, r.stderr


def _with(path: str, value: Any, base: dict[str, Any] = GOOD) -> dict[str, Any]:
    """``base`` with the value at a dotted ``path`` replaced (None: removed)."""
    doc = yaml.safe_load(yaml.safe_dump(base))
    *parents, last = path.split(".")
    node = doc
    for p in parents:
        node = node[p]
    if value is None:
        node.pop(last)
    else:
        node[last] = value
    return doc


def test_a_good_description_projects(tmp_path: Path) -> None:
    code, out, err = _run(tmp_path, GOOD)
    assert code == 0, err
    assert out.splitlines()[0].startswith("workload,gpus,method,batch,compute_ms")
    assert len(out.splitlines()) == 1 + 2 * 2  # two GPU counts x two methods
    assert "modelled: every number above is computed from the declared cluster" in err
    assert "no band: this cluster names no validation" in err


BAD = [
    # (what, cluster, study, the words the one line must hold)
    ("missing device speed", _with("device.compute", {}), STUDY,
     "device.compute: no speed for workload 'w'; add `w: {samples_per_s: ..., batch: ...}`"),
    ("unknown collective", _with("collective", "nccl-rng"), STUDY,
     "unknown collective 'nccl-rng' (did you mean 'nccl-ring'?)"),
    ("no collective", _with("collective", None), STUDY, "collective is missing; give one of"),
    ("zero rate", _with("intra.rate", "0gbit"), STUDY, "intra.rate must be a positive rate"),
    ("negative rate", _with("inter.rate", "-5gbit"), STUDY, "inter.rate must be a positive rate"),
    ("devices do not divide", {**_with("devices_per_node", None), "devices": 10, "nodes": 4},
     STUDY, "devices: 10 do not divide among 4 nodes"),
    ("zero nodes", _with("nodes", 0), STUDY, "nodes must be a whole number of 1 or more, got 0"),
    ("no inter link", _with("inter", None), STUDY, "inter is missing: the link between nodes"),
    ("negative latency", _with("intra.latency", "-1us"), STUDY, "intra.latency must be a duration"),
    ("unknown key", {**GOOD, "colective": "x"}, STUDY, "unknown cluster key 'colective'"),
    ("no codec for a compressor", _with("device.codec", None), STUDY,
     "device.codec is missing: qsgd-4b-b512 codes its payload"),
    ("codec rate zero", _with("device.codec.encode", 0), STUDY,
     "device.codec.encode must be a positive number, got 0"),
    ("efficiency over 1", _with("device", {"name": "g", "flops_per_s": 1e15, "efficiency": 2}),
     STUDY, "device.efficiency must be at most 1"),
    ("host values missing", {**_with("collective", "mpi-host"), "host": {"stage": "8gbit"}},
     STUDY, "host.bus: missing"),
    ("calibrated without cells", {**_with("collective", "mpi-host"), "host": "calibrated"},
     STUDY, "host: calibrated needs a `calibration: {cells: FILE, use:"),
    ("more GPUs than devices", GOOD, {**STUDY, "gpus": [16]},
     "gpus: 16 is more than the cluster's 8 devices"),
    ("unknown method", GOOD, {**STUDY, "methods": ["qsdg"]}, "unknown compressor 'qsdg'"),
    ("no batch", GOOD,
     {**STUDY, "workloads": [{"name": "w", "params": 10, "tensors": 1}]},
     "workload w: give one of batch"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "cluster", "study", "words"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_description_is_one_line_exit_2(
    tmp_path: Path, what: str, cluster: Any, study: Any, words: str
) -> None:
    code, out, err = _run(tmp_path, cluster, study)
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and err.startswith("qbench: error: "), err
    assert words in err


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    r = qbench("project", str(tmp_path / "nope.yaml"), str(tmp_path / "s.yaml"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "cluster file" in r.stderr and "cannot be read" in r.stderr
