"""The projection as a frame: one row per workload, GPU count and method, with the iteration
breakdown, samples/s and its band (at 2 or more GPUs), the speedup over the best uncompressed
method at that GPU count (16-bit casts included: a compressor must beat bf16, not only fp32)
and the scalability over that baseline's speed at the smallest GPU count. Every number is
modelled; ``rests_on`` says on what."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from qbench.cluster import project
from qbench.cluster.declared import Cluster, Host
from qbench.cluster.study import Study
from qbench.cluster.validate import Band, read_band

COLUMNS = ("workload", "gpus", "method", "batch", "compute_ms", "codec_ms", "comm_ms",
           "iteration_ms", "samples_per_s", "band_low", "band_high", "baseline", "speedup",
           "pays", "scalability", "payload_mb")  # fmt: skip


@dataclass(frozen=True)
class Projection:
    frame: pd.DataFrame
    band: Band | None
    rests_on: tuple[str, ...]
    """One line per input: what compute, codec and links rest on."""


def projection(cluster: Cluster, study: Study, host: Host | None, fitted_on: int = 0) -> Projection:
    kernels = project.kernels_of(cluster)
    band = read_band(cluster.band) if cluster.band else None
    rows = []
    for w in study.workloads:
        for k in study.gpus:
            for m in study.methods:
                b = project.predict(cluster, w, m, k, host, kernels)
                # the band was measured on predicted multi-GPU cells; one GPU is the input
                low, high = (band.range(b.samples_per_s) if band and k > 1
                             else (float("nan"),) * 2)  # fmt: skip
                rows.append({"workload": w.name, "gpus": k, "method": m.label, "batch": b.batch,
                             "compute_ms": 1e3 * b.compute_s, "codec_ms": 1e3 * b.codec_s,
                             "comm_ms": 1e3 * b.comm_s, "iteration_ms": 1e3 * b.iteration_s,
                             "samples_per_s": b.samples_per_s, "band_low": low, "band_high": high,
                             "payload_mb": b.payload_bytes / 1e6,
                             "uncompressed": m.entry.uncompressed})  # fmt: skip
    frame = _speedups(pd.DataFrame(rows))
    rests_on = _rests_on(cluster, study, host, fitted_on, kernels is not None)
    return Projection(frame=frame[list(COLUMNS)], band=band, rests_on=rests_on)


def _speedups(frame: pd.DataFrame) -> pd.DataFrame:
    base = frame[frame["uncompressed"]]
    if base.empty:
        frame["baseline"], frame["speedup"], frame["pays"], frame["scalability"] = (
            "",
            *([float("nan")] * 2),
            False,
        )
        return frame
    best = base.loc[base.groupby(["workload", "gpus"])["samples_per_s"].idxmax()]
    best = best.set_index(["workload", "gpus"])
    key = list(zip(frame["workload"], frame["gpus"], strict=True))
    frame["baseline"] = [best["method"].get(k, "") for k in key]
    frame["speedup"] = [s / best["samples_per_s"].get(k, float("nan"))
                        for s, k in zip(frame["samples_per_s"], key, strict=True)]  # fmt: skip
    frame["pays"] = (~frame["uncompressed"]) & (frame["speedup"] > 1)
    one = best.xs(min(frame["gpus"]), level="gpus")["samples_per_s"]
    frame["scalability"] = frame["samples_per_s"] / frame["workload"].map(one)
    return frame


def _rests_on(cluster: Cluster, study: Study, host: Host | None, fitted_on: int,
              kernels: bool) -> tuple[str, ...]:  # fmt: skip
    dev = cluster.device
    lines = [f"cluster {cluster.name}: {cluster.nodes} node(s) x {cluster.devices_per_node} "
             f"{dev.name}, collective {cluster.collective}"]  # fmt: skip
    for w in study.workloads:
        lines.append(f"compute of {w.name}: {project.compute(cluster, w).source}")
    codec = dev.codec
    if codec is not None:
        lines.append(f"codec: measured, {codec.kernels}" if kernels else
                     f"codec: stated, encode {codec.encode:.3g}/s, decode {codec.decode:.3g}/s "
                     f"values, {codec.launch * 1e6:g} us per kernel")  # fmt: skip
    if host is not None and cluster.collective == "mpi-host":
        how = f"calibrated on {fitted_on} measured cells" if fitted_on else "declared"
        lines.append(f"host ({how}): stage {_rate(host.stage)}, bus {_rate(host.bus)}, "
                     f"latency {host.latency * 1e3:.3g} ms per peer, fixed "
                     f"{host.fixed * 1e3:.3g} ms")  # fmt: skip
    for name, link in (("intra", cluster.intra), ("inter", cluster.inter)):
        if link is not None:
            lines.append(f"{name}: declared {_rate(link.rate)}, latency "
                         f"{link.latency * 1e6:.3g} us")  # fmt: skip
    return tuple(lines)


def _rate(bytes_per_s: float) -> str:
    return (
        "unlimited (no cost found)"
        if bytes_per_s == float("inf")
        else (f"{8 * bytes_per_s / 1e9:.3g} Gbit/s")
    )
