"""Measurements as fit points: bench comm rows and sweep runs -> comm, codec and compute points.

**Compute:** median ``t_compute`` and ``t_step`` per (workload, batch size, device) from sweep
runs; the step is elementwise (SGD with momentum), so it scales with the gradient size while
compute stays fixed: a model "grown" to more parameters at the same FLOPs, like seed 002's
AlexNet with larger fully connected layers. Ranks on one host slow each other down (memory
bandwidth, the comm library's threads) even with a core each, so a world size the runs had
(on a host with the same core count) keeps that world size's medians (``per_world_size``);
the per-rank medians of all runs serve the others. CPU ranks that share cores (``machine.json``
core count) ran max(1, K / cores) times slower: that is divided out of compute and codec times.

**Imbalance:** the iteration time is the slowest rank's, the phases are means over ranks; their
ratio ``t_iteration / (compute + encode + comm + decode + step)`` is fitted per (backend,
scheme, K) from runs (median, at least 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from qbench.costmodel.config import Config
from qbench.costmodel.formulas import CommItem, codec_units, comm_plan, payload_bits
from qbench.costmodel.inputs import (
    RUN_PARTS,
    bench_compressor,
    bench_scheme,
    float_or_nan,
    int_or_none,
    row_bits,
    run_key,
    run_scheme,
)
from qbench.costmodel.model import ComputeFit, CostModel, imbalance_key, solo_key
from qbench.costmodel.schemes import NONE, Scheme, full_precision, nominal_bits_per_value
from qbench.errors import UserError
from qbench.spec.network import Link
from qbench.spec.scenario import REPLAY


@dataclass(frozen=True, kw_only=True)
class CommPoint:
    backend: str
    network: str
    collective: str
    world_size: int
    msgs: float
    calls: tuple[float, ...]
    """Wire bytes per rank of each collective call in the phase."""
    seconds: float
    source: str
    scheme: str
    compressor: str
    bytes: int

    @property
    def wire_bytes(self) -> float:
        return float(sum(self.calls))


@dataclass(frozen=True, kw_only=True)
class PhasePoint:
    backend: str
    scheme: str
    compressor: str
    op: str
    world_size: int
    units: float
    seconds: float
    source: str
    bytes: int


def bench_points(
    rows: Sequence[dict[str, Any]], source: str
) -> tuple[list[CommPoint], list[PhasePoint], list[dict[str, Any]], list[str]]:
    """Synchronised rows -> comm and phase points; overlapped rows are returned for later."""
    comm: list[CommPoint] = []
    phases: list[PhasePoint] = []
    overlapped: list[dict[str, Any]] = []
    notes: list[str] = []
    for r in rows:
        try:
            scheme = bench_scheme(r)
        except UserError:
            notes.append(f"{source}: no model for scheme {r['scheme']}; its rows are not used")
            continue
        try:
            comp = bench_compressor(r)
        except UserError:
            notes.append(f"{source}: no compressor {r['compressor']}; its rows are not used")
            continue
        k, s = int(r["world_size"]), int(r["bytes"])
        n = s / 4
        if scheme.overlap > 1 or r.get("t_comm_s") is None:
            overlapped.append(r)
            continue
        item = comm_plan(scheme, comp, k, n, row_bits(r), r["backend"])
        comm.append(CommPoint(
            backend=r["backend"], network=r["network"], collective=item.collective, world_size=k,
            msgs=item.msgs, calls=measured_calls(item, r.get("wire_bytes")),
            seconds=float(r["t_comm_s"]), scheme=scheme.label,
            compressor=r["compressor"], source=source, bytes=s,
        ))  # fmt: skip
        for op in ("encode", "decode"):
            t = float_or_nan(r.get(f"t_{op}_s"))
            if math.isfinite(t):
                phases.append(PhasePoint(
                    backend=r["backend"], scheme=scheme.name, compressor=r["compressor"], op=op,
                    world_size=k, units=codec_units(scheme.name, k, n, op), seconds=t,
                    source=source, bytes=s,
                ))  # fmt: skip
    return comm, phases, overlapped, notes


def measured_calls(item: CommItem, wire: Any) -> tuple[float, ...]:
    """The plan's per-call bytes, rescaled to the measured total when there is one."""
    if wire is None or not item.wire or not math.isfinite(float(wire)):
        return item.calls
    return tuple(c * float(wire) / item.wire for c in item.calls)


def _fp32_numel(n: int, payload: float, bits: float) -> int:
    """Values the layer policy kept in fp32, from the payload size: payload = 4 f + (n - f) b/8."""
    if not (math.isfinite(payload) and bits < 32 and n > 0):
        return 0
    f = (payload - n * bits / 8) / (4 - bits / 8)
    return int(min(max(round(f), 0), n))


def run_config(r: Any, model: CostModel | None = None) -> tuple[Scheme, Config] | None:
    scheme = run_scheme(r)
    if scheme is None:
        return None
    comp = r.specs.compressor  # run_scheme found the specs
    k, n = int(r.world_size), int_or_none(r.numel) or 0
    if n <= 0:
        n = int(r.grad_bytes // 4) if pd.notna(r.grad_bytes) else 0
    if n <= 0:
        return None
    bits = nominal_bits_per_value(comp)
    if bits is None and model is not None:
        bits = model.compressors.get(comp.label)
    if bits is None:
        bits = 8 * float(r.payload_bytes) / n if pd.notna(r.payload_bytes) else 32.0
    pbits = payload_bits(scheme, comp, bits, str(r.backend), k)
    f = 0 if full_precision(comp) else _fp32_numel(n, float(r.payload_bytes), pbits)
    cfg = Config(
        scheme=scheme, compressor=comp, bits_per_value=bits, backend=str(r.backend),
        network=r.link, world_size=k, topology=getattr(r, "topology", None), numel=n,
        fp32_numel=f, workload=str(r.workload), batch_size=int_or_none(r.batch_size),
        device=str(r.device), host_cores=run_host_cores(r), replayed_compute=replayed(r),
    )  # fmt: skip
    return scheme, cfg


def replayed(r: Any) -> bool:
    """Whether a run-table row replayed its compute (``compute: replay``: sleeps, no CPU)."""
    return str(getattr(r, "compute", "fp32")) == REPLAY


def run_host_cores(r: Any) -> int | None:
    """CPU cores the run's ranks shared: the host's cores x nodes (None on GPUs or unknown;
    emulated nodes share one host's cores). K CPU ranks on fewer cores compute K / cores times
    slower (``Config.host_cores``)."""
    cores = int_or_none(getattr(r, "host_cores", None))
    if not cores or str(getattr(r, "device", "cpu")) != "cpu":
        return None
    if getattr(r, "emulated", False) is True:
        return cores
    return cores * (int_or_none(getattr(r, "nodes", None)) or 1)


def level_link(cfg: Config) -> Link | None:
    """The one link a run's comm phase crossed, which its fit point belongs to: its link
    without a topology; with one, the intra link on one node, the inter link with one rank per
    node; None when it crossed both (those runs are predicted, not fitted) or its scheme runs per
    level (hierarchical)."""
    topo = cfg.topology
    if topo is None:
        return None if cfg.scheme.levelled else cfg.network
    if cfg.scheme.levelled or (topo.nodes > 1 and topo.ranks_per_node > 1):
        return None
    return topo.intra if topo.nodes == 1 else topo.inter


def fitted_topologies(table: pd.DataFrame) -> list[str]:
    """``NxG`` of the runs with a topology (``CostModel.topologies``)."""
    topos = {t for t in table.get("topology", pd.Series(dtype=object)) if t is not None}
    return sorted({f"{t.nodes}x{t.ranks_per_node}" for t in topos})


def _row_share(r: Any) -> float:
    """``_cpu_share`` of a run-table row."""
    cores = run_host_cores(r)
    return max(1.0, int(r.world_size) / cores) if cores else 1.0


def _compute_share(r: Any) -> float:
    """``_row_share`` for compute and step: 1 where they were replayed (slept, no CPU)."""
    return 1.0 if replayed(r) else _row_share(r)


def _cpu_share(cfg: Config) -> float:
    """How much slower CPU work ran than on a core of its own: max(1, K / host_cores)."""
    return max(1.0, cfg.world_size / cfg.host_cores) if cfg.host_cores else 1.0


def _comm_items(scheme: Scheme, cfg: Config) -> list[CommItem]:
    n = cfg.numel or 0
    items = [
        comm_plan(scheme, cfg.compressor, cfg.world_size, n - cfg.fp32_numel,
                  cfg.bits_per_value or 32.0, cfg.backend)
    ]  # fmt: skip
    if cfg.fp32_numel > 0 and not full_precision(cfg.compressor):
        items.append(comm_plan(scheme, NONE, cfg.world_size, cfg.fp32_numel, 32.0, cfg.backend))
    return items


def _phased_runs(table: pd.DataFrame) -> Iterable[tuple[Any, Scheme, float]]:
    """(row, scheme, sum of the phases) of runs whose phases add up to the iteration: a known
    scheme without overlap, every phase measured."""
    for r in table.itertuples(index=False):
        if not all(pd.notna(getattr(r, p)) for p in (*RUN_PARTS, "t_iteration")):
            continue
        scheme = run_scheme(r)
        if scheme is not None and scheme.overlap == 1:
            yield r, scheme, sum(float(getattr(r, p)) for p in RUN_PARTS)


def fit_imbalance(table: pd.DataFrame) -> dict[str, float]:
    """Per (backend, scheme, K > 1): the median of the iteration time (max over ranks) over the
    sum of the phases (means over ranks). Ranks finish a step at different times; the slowest
    sets the pace, and no phase is charged for it."""
    ratios: dict[str, list[float]] = {}
    for r, scheme, parts in _phased_runs(table):
        if int(r.world_size) > 1 and parts > 0:
            key = imbalance_key(str(r.backend), scheme.label, int(r.world_size))
            ratios.setdefault(key, []).append(float(r.t_iteration) / parts)
    return {k: max(1.0, float(np.median(v))) for k, v in sorted(ratios.items())}


def fit_solo_comm(table: pd.DataFrame) -> dict[str, float]:
    """Per (backend, scheme, workload) of 1-rank runs: the median comm phase."""
    times: dict[str, list[float]] = {}
    for r, scheme, _ in _phased_runs(table):
        if int(r.world_size) == 1:
            key = solo_key(str(r.backend), scheme.label, str(r.workload))
            times.setdefault(key, []).append(float(r.t_comm))
    return {k: float(np.median(v)) for k, v in sorted(times.items())}


def run_points(
    table: pd.DataFrame, with_comm: bool
) -> tuple[list[CommPoint], list[PhasePoint], list[ComputeFit], list[str]]:
    comm: list[CommPoint] = []
    phases: list[PhasePoint] = []
    groups: dict[tuple[str, int, str], list[Any]] = {}
    used: list[str] = []
    for r in table.itertuples(index=False):
        key = (str(r.workload), int_or_none(r.batch_size) or 0, str(r.device))
        groups.setdefault(key, []).append(r)
        used.append(run_key(str(r.run_id)))
        got = run_config(r)
        if got is None:
            continue
        scheme, cfg = got
        if scheme.overlap > 1 or not all(pd.notna(getattr(r, p)) for p in RUN_PARTS):
            continue
        k, n = cfg.world_size, (cfg.numel or 0) - cfg.fp32_numel
        src, nbytes = str(r.source), 4 * (cfg.numel or 0)
        if scheme.levelled:  # timed from the one-level fits (qbench.costmodel.levels)
            continue
        for op in ("encode", "decode"):
            phases.append(PhasePoint(
                backend=cfg.backend, scheme=scheme.name, compressor=cfg.compressor.label, op=op,
                world_size=k, units=codec_units(scheme.name, k, n, op),
                seconds=float(getattr(r, f"t_{op}")) / _cpu_share(cfg), source=src, bytes=nbytes,
            ))  # fmt: skip
        link = level_link(cfg)
        if with_comm and k > 1 and link is not None:
            items = _comm_items(scheme, cfg)
            if len({i.collective for i in items}) == 1:  # one key: the phase is one point
                merged = CommItem(
                    items[0].collective, sum(i.msgs for i in items),
                    tuple(c for i in items for c in i.calls),
                )  # fmt: skip
                comm.append(CommPoint(
                    backend=cfg.backend, network=link.label, collective=merged.collective,
                    world_size=k, msgs=merged.msgs, calls=measured_calls(merged, r.bytes_sent),
                    seconds=float(r.t_comm), scheme=scheme.label,
                    compressor=cfg.compressor.label, source=src, bytes=nbytes,
                ))  # fmt: skip
    compute = []
    for (workload, batch, device), rs in sorted(groups.items()):
        ks = sorted({int(r.world_size) for r in rs})
        cores = {run_host_cores(r) for r in rs}
        per_k = {
            str(k): [float(np.median([getattr(r, p) for r in rs if int(r.world_size) == k]))
                     for p in ("t_compute", "t_step")]
            for k in ks
        } if len(cores) == 1 else {}  # fmt: skip
        compute.append(ComputeFit(
            workload=workload, batch_size=batch, device=device,
            compute_s=float(np.median([r.t_compute / _compute_share(r) for r in rs])),
            step_s=float(np.median([r.t_step / _compute_share(r) for r in rs])),
            numel=int(np.median([r.grad_bytes // 4 for r in rs])), runs=len(rs),
            world_sizes=ks, per_world_size=per_k,
            host_cores=next(iter(cores)) if len(cores) == 1 else None,
        ))  # fmt: skip
    return comm, phases, compute, used
