"""Provenance: what machine and software produced a result. Anything unavailable says why.

Loads no torch when imported (the launchers import it): torch and the kernel modules only when
:func:`versions` or ``qbench info``'s probes ask, and the optional libraries (pynvml, mpi4py,
cupy) through :func:`_optional`, each when asked; one missing or broken is reported, not raised.
"""

from __future__ import annotations

import importlib
import os
import platform
import socket
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy
import pandas

from qbench.launch import local, netns
from qbench.launch.slurm import available as slurm_available


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _optional(name: str) -> ModuleType:
    """An optional library (pynvml, mpi4py, cupy), imported when a probe asks: each may be
    missing or broken (a wheel without its shared library), which the caller reports instead of
    failing; importing this module loads none of them (the launchers import it)."""
    return importlib.import_module(name)


def gpus() -> dict[str, Any]:
    """GPUs, driver and interconnect topology via NVML, or the reason there are none."""
    try:
        pynvml: Any = _optional("pynvml")
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound on machines without a driver
        return {"count": 0, "devices": [], "unavailable": f"NVML: {type(e).__name__}: {e}"}
    try:
        n = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        devices = [_device(pynvml, i, h) for i, h in enumerate(handles)]
        return {
            "count": n, "driver": _nvml(pynvml.nvmlSystemGetDriverVersion),
            "cuda_driver": _nvml(pynvml.nvmlSystemGetCudaDriverVersion), "devices": devices,
            "topology": _topology(pynvml, handles),
        }  # fmt: skip
    finally:
        pynvml.nvmlShutdown()


def _nvml(fn: Any, *args: Any) -> Any:
    """One NVML query; a query the GPU or driver does not support gives the reason instead."""
    try:
        value = fn(*args)
    except Exception as e:
        return f"unavailable: {type(e).__name__}"
    return value.decode() if isinstance(value, bytes) else value


def _device(pynvml: Any, index: int, h: Any) -> dict[str, Any]:
    mem = _nvml(pynvml.nvmlDeviceGetMemoryInfo, h)
    pci = _nvml(pynvml.nvmlDeviceGetPciInfo, h)
    links = []
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _nvml(pynvml.nvmlDeviceGetNvLinkState, h, link)
        if isinstance(state, str):  # no such link
            break
        links.append(bool(state))
    return {
        "index": index,
        "name": _nvml(pynvml.nvmlDeviceGetName, h),
        "memory_gib": round(mem.total / 2**30, 1) if not isinstance(mem, str) else mem,
        "pci_bus_id": _nvml(lambda: pci.busId) if not isinstance(pci, str) else pci,
        "pcie_gen": _nvml(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_width": _nvml(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        "nvlinks_active": sum(links),
        "nvlinks": len(links),
    }


# nvmlDeviceGetTopologyCommonAncestor levels, as nvidia-smi topo -m names them.
_TOPO = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _topology(pynvml: Any, handles: list[Any]) -> dict[str, str]:
    """GPU pair -> NV (NVLink between them) or the PCIe path (PIX/PXB/PHB/NODE/SYS)."""
    out: dict[str, str] = {}
    for i, a in enumerate(handles):
        for j in range(i + 1, len(handles)):
            level = _nvml(pynvml.nvmlDeviceGetTopologyCommonAncestor, a, handles[j])
            p2p = _nvml(
                pynvml.nvmlDeviceGetP2PStatus, a, handles[j],
                getattr(pynvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2),
            )  # fmt: skip
            nv = p2p == getattr(pynvml, "NVML_P2P_STATUS_OK", 0)
            out[f"{i}-{j}"] = "NV" if nv else _TOPO.get(level, str(level))
    return out


def versions() -> dict[str, Any]:
    import torch  # torch only for a sweep's provenance and `qbench info`: the launchers load none

    v: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "pandas": pandas.__version__,
        "nccl": _nccl_version(torch),
    }
    v.update(_mpi_versions())
    v["cupy"] = _cupy_version()
    return v


def _nccl_version(torch: Any) -> str | None:
    try:
        return ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:
        return None


def _mpi_versions() -> dict[str, Any]:
    try:
        mpi4py: Any = _optional("mpi4py")
        mpi4py.rc.initialize = False  # MPI_Get_library_version needs no MPI_Init
        MPI: Any = _optional("mpi4py.MPI")
        return {
            "mpi4py": mpi4py.__version__,
            "mpi": MPI.Get_library_version().splitlines()[0].strip(" \x00"),
        }
    except Exception as e:
        return {"mpi4py": None, "mpi": f"unavailable: {e}"}


def _cupy_version() -> str | None:
    try:
        return str(_optional("cupy").__version__)
    except Exception:
        return None


def git_commit() -> str | None:
    """Commit of the qbench source tree (with ``-dirty`` when it has local changes)."""
    src = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def capabilities() -> list[tuple[str, str]]:
    """(what, status) rows for ``qbench info``: each usable, or unavailable and why."""
    rows: list[tuple[str, str]] = []
    mach = collect()
    rows.append(("host", f"{mach['hostname']} ({mach['platform']})"))
    rows.append(("cpu", f"{mach['cpu']} ({mach['cores']} cores, {mach['memory_gib']} GiB)"))
    g = mach["gpus"]
    if g["count"]:
        names = ", ".join(str(d["name"]) for d in g["devices"])
        topo = " ".join(f"{k}:{v}" for k, v in g["topology"].items())
        rows.append(("gpus", f"{g['count']} ({names}); driver {g['driver']}; {topo}".strip()))
    else:
        rows.append(("gpus", f"none ({g['unavailable']})"))
    rows.append(("backend gloo", "available (torch.distributed, CPU)"))
    rows.append(("backend mpi", _probe(_mpi_status)))
    rows.append(("backend nccl", _probe(_nccl_status)))
    rows.append(("emulated links", _probe(_netns_status)))
    rows.append(("launcher local", "available (torchrun, mpirun)"))
    rows.append(("launcher slurm", _probe(_slurm_status)))
    rows.append(("CPU kernels", _probe(_native_status)))
    rows.append(("GPU kernels (cupy)", _probe(_cupy_status)))
    rows.extend((k, str(v)) for k, v in versions().items())
    return rows


def _probe(fn: Any) -> str:
    try:
        return str(fn())
    except Exception as e:  # every probe says why instead of failing the command
        return f"unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}"


def _mpi_status() -> str:
    return f"available ({local.find_mpirun()})"


def _nccl_status() -> str:
    local.check_available(["nccl"], 1)
    return "available"


def _netns_status() -> str:
    netns.check_available()
    return "available (network namespaces + tc tbf; `network: {bandwidth: 1gbit}`)"


def _slurm_status() -> str:
    return slurm_available.describe()


def _native_status() -> str:
    from qbench.compress.kernels import native  # torch: only for `qbench info`, not the launchers

    if native.available():
        return "available (fused C loops, built for this CPU)"
    broken = native.build_error()  # a compiler is here: a bug, which the test suite fails on
    if broken:
        return f"broken: {broken} (torch fallback)"
    return f"unavailable: {native.why_unavailable()} (torch fallback)"


def _cupy_status() -> str:
    from qbench.compress.kernels import cuda  # torch and cupy: only for `qbench info`

    return "available" if cuda.available() else f"unavailable: {cuda.why_unavailable()}"


def collect() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpus": gpus(),
    }
