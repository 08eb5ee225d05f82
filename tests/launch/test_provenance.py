"""machine.json contents: GPUs and topology from NVML (a fake NVML here), and `qbench info` rows
that say why anything is unavailable instead of failing."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from qbench.launch import machine


class _NVMLError(Exception):
    pass


def fake_nvml(n: int, nvlinked: set[tuple[int, int]]) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    handles = [f"gpu{i}" for i in range(n)]
    idx = {h: i for i, h in enumerate(handles)}

    def link_state(h: str, link: int) -> int:
        if link >= 4:
            raise _NVMLError("not supported")
        return 1 if any(idx[h] in pair for pair in nvlinked) and link < 2 else 0

    def p2p(a: str, b: str, cap: int) -> int:
        return 0 if tuple(sorted((idx[a], idx[b]))) in nvlinked else 3

    calls: dict[str, Any] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: n,
        "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
        "nvmlDeviceGetName": lambda h: b"Fake GPU",
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(total=80 * 2**30),
        "nvmlDeviceGetPciInfo": lambda h: types.SimpleNamespace(busId=f"0000:{idx[h]:02x}:00.0"),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: 5,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 16,
        "nvmlDeviceGetNvLinkState": link_state,
        "nvmlDeviceGetTopologyCommonAncestor": lambda a, b: 30,
        "nvmlDeviceGetP2PStatus": p2p,
        "nvmlSystemGetDriverVersion": lambda: "999.1",
        "nvmlSystemGetCudaDriverVersion": lambda: (_ for _ in ()).throw(_NVMLError("old")),
        "NVML_P2P_CAPS_INDEX_NVLINK": 2,
        "NVML_P2P_STATUS_OK": 0,
    }
    for k, v in calls.items():
        setattr(m, k, v)
    return m


def test_gpus_topology_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(3, {(0, 1)}))
    g = machine.gpus()
    assert g["count"] == 3 and g["driver"] == "999.1"
    assert g["cuda_driver"].startswith("unavailable")  # an unsupported query says so
    assert g["topology"] == {"0-1": "NV", "0-2": "PHB", "1-2": "PHB"}
    d0 = g["devices"][0]
    assert d0["memory_gib"] == 80.0 and d0["pci_bus_id"] == "0000:00:00.0"
    assert (d0["nvlinks"], d0["nvlinks_active"]) == (4, 2)
    assert g["devices"][2]["nvlinks_active"] == 0


def test_no_nvml_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = types.ModuleType("pynvml")

    def fail() -> None:
        raise _NVMLError("NVML Shared Library Not Found")

    broken.nvmlInit = fail  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    g = machine.gpus()
    assert g["count"] == 0 and "NVML Shared Library Not Found" in g["unavailable"]


def test_info_rows_never_fail_and_say_why() -> None:
    rows = dict(machine.capabilities())
    for key in ("gpus", "backend gloo", "backend mpi", "backend nccl", "emulated links",
                "launcher slurm", "CPU kernels", "GPU kernels (cupy)", "torch", "mpi"):  # fmt: skip
        assert rows.get(key), key
    if rows["gpus"].startswith("none"):
        assert "(" in rows["gpus"]  # the reason
        assert rows["backend nccl"].startswith("unavailable:")
