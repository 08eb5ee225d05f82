"""DDP bucket profiles from runs: what ``qbench.costmodel.overlap`` needs of a model, measured once.

Per (workload, batch size, device, world size, bucket cap) of the DDP runs (``overlap:
backward``) in the results: each bucket's numel and hand-over instant after backward started
(``buckets.parquet``: median over measured iterations and ranks; warm-up and the first iteration,
before DDP rebuilds its buckets in gradient-ready order, are left out), and forward, backward
compute (``t_compute - t_forward``) and step times (medians over runs of their medians).

Any DDP run will do, since the buckets are handed over when backward computes them, whatever is
sent; the times come from the runs least disturbed by communication: torch's fp32 ``ddp`` on an
unshaped link first, then on other links, then other fp32 runs, then any. PowerSGD's per-bucket
payloads come from its own runs of the workload (any world size).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from qbench.catalog.schemes import DEFAULT_BUCKET_CAP_MB
from qbench.costmodel.fit.points import run_host_cores
from qbench.costmodel.inputs import compressor_name, run_scheme, scheme_name
from qbench.costmodel.model import BucketProfile
from qbench.costmodel.schemes import DDP, FP32, POWERSGD, Scheme
from qbench.records.store import ResultStore

Key = tuple[str, int, str, int, float]
"""(workload, batch size, device, world size, bucket cap in MB)."""


def fit_bucket_profiles(table: pd.DataFrame) -> tuple[list[BucketProfile], list[str]]:
    """One profile per key of the DDP runs in ``table`` (``run_table`` rows), with notes on runs
    that could not be used."""
    groups: dict[Key, list[tuple[Any, pd.DataFrame]]] = {}
    notes: list[str] = []
    for r in table.itertuples(index=False):
        scheme = _backward_scheme(r)
        if scheme is None:
            continue
        buckets = _measured_buckets(r)
        if buckets is None:
            notes.append(f"{r.run_id}: DDP run without buckets.parquet; not in the bucket profile")
            continue
        cap = scheme.bucket_cap_mb or DEFAULT_BUCKET_CAP_MB
        key = (str(r.workload), _int(r.batch_size), str(r.device), int(r.world_size), cap)
        groups.setdefault(key, []).append((r, buckets))
    payloads = _powersgd_payloads(groups)
    profiles = []
    for key, members in sorted(groups.items()):
        got = _profile(key, members, payloads.get((*key[:3], key[4]), {}))
        if isinstance(got, str):
            notes.append(got)
        else:
            profiles.append(got)
    return profiles, notes


def _backward_scheme(r: Any) -> Scheme | None:
    scheme = run_scheme(r)
    return scheme if scheme is not None and scheme.backward else None


def _measured_buckets(r: Any) -> pd.DataFrame | None:
    """The run's bucket rows of measured iterations after DDP's rebuild; None without a file."""
    path = ResultStore(str(r.source)).buckets_path(str(r.run_id))
    if not path.exists():
        return None
    frame = pd.read_parquet(path)
    if frame.empty:
        return frame
    first = frame["iteration"].min()
    return frame[~frame["warmup"].astype(bool) & (frame["iteration"] > first)]


def _preference(r: Any) -> tuple[bool, bool, bool]:
    """Runs least disturbed by communication first: fp32 ddp, then fp32, then unshaped."""
    return str(r.compressor) != FP32, scheme_name(r) != DDP, r.link.shaped


def _profile(
    key: Key, members: list[tuple[Any, pd.DataFrame]], payloads: dict[str, list[float]]
) -> BucketProfile | str:
    """The profile of one key from its best runs, or why there is none."""
    best = min(_preference(r) for r, _ in members)
    chosen = [(r, b) for r, b in members if _preference(r) == best and not b.empty]
    layouts = Counter(_layout(b) for _, b in chosen)
    if not layouts:
        return f"{key[0]} at {key[3]} ranks: DDP runs without measured buckets; no profile"
    layout = layouts.most_common(1)[0][0]
    chosen = [(r, b) for r, b in chosen if _layout(b) == layout]
    rows = pd.concat([b for _, b in chosen], ignore_index=True)
    handed = rows.groupby("bucket")["t_handed"].median().sort_index()
    runs = [r for r, _ in chosen]
    r0 = runs[0]
    cores = {run_host_cores(r) for r in runs}
    return BucketProfile(
        workload=key[0], batch_size=key[1], device=key[2], world_size=key[3],
        bucket_cap_mb=key[4], numel=list(layout), handed_s=[float(t) for t in handed],
        forward_s=_median(r.t_forward for r in runs),
        backward_s=_median(r.t_compute - r.t_forward for r in runs),
        step_s=_median(r.t_step for r in runs),
        imbalance=max(1.0, _median(r.t_iteration / (r.t_compute + r.t_comm + r.t_step)
                                   for r in runs)),
        host_cores=cores.pop() if len(cores) == 1 else None, runs=len(runs),
        measured=f"{r0.scheme} {r0.compressor} {r0.network}",
        payload_bytes={k: v for k, v in payloads.items() if len(v) == len(layout)},
    )  # fmt: skip


def _layout(buckets: pd.DataFrame) -> tuple[int, ...]:
    """Each bucket's numel, by bucket index (the hand-over order)."""
    numel = buckets.groupby("bucket")["numel"].median().sort_index()
    return tuple(int(n) for n in numel)


def _powersgd_payloads(
    groups: dict[Key, list[tuple[Any, pd.DataFrame]]],
) -> dict[tuple[str, int, str, float], dict[str, list[float]]]:
    """(workload, batch, device, cap) -> PowerSGD label -> median payload per bucket."""
    rows: dict[tuple[tuple[str, int, str, float], str], list[pd.DataFrame]] = {}
    for key, members in groups.items():
        for r, buckets in members:
            if compressor_name(r) == POWERSGD and not buckets.empty:
                rows.setdefault(((*key[:3], key[4]), str(r.compressor)), []).append(buckets)
    out: dict[tuple[str, int, str, float], dict[str, list[float]]] = {}
    for (where, label), frames in sorted(rows.items()):
        both = pd.concat(frames, ignore_index=True)
        median = both.groupby("bucket")["payload_bytes"].median().sort_index()
        out.setdefault(where, {})[label] = [float(p) for p in median]
    return out


def _median(values: Any) -> float:
    got = [float(v) for v in values]
    return float(np.median(got)) if got else math.nan


def _int(v: Any) -> int:
    return 0 if v is None or pd.isna(v) else int(v)
