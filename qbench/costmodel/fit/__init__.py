"""Fit every parameter the inputs allow (``qbench cost fit``).

Collectives from ``bench comm`` rows (``qbench.costmodel.fit.lsq``), or approximately from the
runs' ``t_comm`` (``comm_from_runs``); pipelined rows (``overlap: C``) fit ``exchange+overlap``
/ ``allreduce-int+overlap`` from rows where comm bounds the pipeline; codec phases and kernels;
compute, imbalance and 1-rank comm from runs (``qbench.costmodel.fit.points``); the bucket profiles
of DDP runs (``qbench.costmodel.profiles``).

**Bench comm for fitting:** ``qbench bench comm --sync stream --gap-ms G`` (calls back to back,
each after G ms of busy CPU, like training steps with G ms of compute) reproduces what ranks
sharing cores see: waits for ranks the scheduler paused. With a core per rank the default
barrier benches predicted held-out runs better (README, "Cost model against held-out runs"):
back to back, Open MPI's 2-rank TCP allreduce flips at random between the link rate and half of
it, and after a barrier it stays at the link rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qbench.costmodel.fit.lsq import fit_collective, fit_linear
from qbench.costmodel.fit.points import (
    CommPoint,
    PhasePoint,
    bench_points,
    fit_imbalance,
    fit_solo_comm,
    fitted_topologies,
    measured_calls,
    run_points,
)
from qbench.costmodel.formulas import burst_s, comm_plan
from qbench.costmodel.inputs import (
    bench_compressor,
    bench_key,
    bench_scheme,
    comm_rows,
    held_out,
    integer_row,
    kernel_rows,
    row_bits,
    run_table,
)
from qbench.costmodel.model import CodecFit, CollectiveFit, CostModel
from qbench.costmodel.phases import codec_time
from qbench.costmodel.powersgd import fit_local_work
from qbench.costmodel.profiles import fit_bucket_profiles
from qbench.costmodel.schemes import Scheme
from qbench.errors import UserError
from qbench.spec import network


def _fit_kernels(rows: Sequence[tuple[dict[str, Any], str]]) -> list[CodecFit]:
    groups: dict[tuple[str, str, str], list[tuple[float, float, str]]] = {}
    copies: dict[tuple[str, int], list[float]] = {}
    for r, source in rows:
        device = str(r.get("device", "cpu")).split(":")[0]
        groups.setdefault((r["compressor"], r["op"], device), []).append(
            (float(r["numel"]), float(r["seconds"]), source)
        )
        copies.setdefault((device, int(r["numel"])), []).append(float(r["copy_seconds"]))
    for (device, numel), ts in copies.items():
        groups.setdefault(("", "copy", device), []).append(
            (float(numel), float(np.median(ts)), "copy_seconds")
        )
    fits = []
    for (comp, op, device), pts in sorted(groups.items()):
        x = np.array([[1.0, p[0]] for p in pts])
        coef, q = fit_linear(x, np.array([p[1] for p in pts]))
        fits.append(CodecFit(
            backend="", scheme="", compressor=comp, op=op, device=device, c0_s=float(coef[0]),
            c1_s=float(coef[1]), **asdict(q),
            data=[{"numel": p[0], "seconds": p[1], "source": p[2]} for p in pts],
        ))  # fmt: skip
    return fits


def _fit_phases(points: Sequence[PhasePoint]) -> list[CodecFit]:
    groups: dict[tuple[str, str, str, str], list[PhasePoint]] = {}
    for p in points:
        groups.setdefault((p.backend, p.scheme, p.compressor, p.op), []).append(p)
    fits = []
    for (backend, scheme, comp, op), pts in sorted(groups.items()):
        x = np.array([[1.0, p.units] for p in pts])
        coef, q = fit_linear(x, np.array([p.seconds for p in pts]))
        fits.append(CodecFit(
            backend=backend, scheme=scheme, compressor=comp, op=op, device="cpu",
            c0_s=float(coef[0]), c1_s=float(coef[1]), **asdict(q),
            data=[{"world_size": p.world_size, "units": p.units, "seconds": p.seconds,
                   "bytes": p.bytes, "source": p.source} for p in pts],
        ))  # fmt: skip
    return fits


def fit_collectives(points: Sequence[CommPoint]) -> list[CollectiveFit]:
    """alpha, beta (and on emulated links the burst credit) per (backend, network,
    collective)."""
    groups: dict[tuple[str, str, str], list[CommPoint]] = {}
    for p in points:
        groups.setdefault((p.backend, p.network, p.collective), []).append(p)
    fits = []
    for (backend, net, coll), pts in sorted(groups.items()):
        alpha, beta, credit, q = fit_collective(
            np.array([p.msgs for p in pts]), [p.calls for p in pts],
            np.array([p.seconds for p in pts]), burst_s(network.option(net)),
        )  # fmt: skip
        fits.append(CollectiveFit(
            backend=backend, network=net, collective=coll, alpha_s=alpha, beta_s_per_byte=beta,
            credit_s=credit, **asdict(q),
            data=[{k: v for k, v in asdict(p).items()
                   if k not in ("backend", "network", "collective")} for p in pts],
        ))  # fmt: skip
    return fits


def fit(
    *,
    comm_docs: Sequence[tuple[Any, str]] = (),
    kernel_docs: Sequence[tuple[Any, str]] = (),
    run_dirs: Sequence[Path | str] = (),
    comm_from_runs: bool = False,
    hold_out: Sequence[tuple[str, str]] = (),
) -> CostModel:
    """Fit every parameter the inputs allow. comm_docs / kernel_docs: (parsed JSON, name).
    hold_out: (label, value) pairs; runs with any such label value (compared as text, e.g.
    ``("world_size", "4")``, ``("network", "300mbit")``) are left out of the fit, so that
    ``validate`` scores them as held-out."""
    model = CostModel()
    comm: list[CommPoint] = []
    phases: list[PhasePoint] = []
    overlapped: list[tuple[dict[str, Any], str]] = []
    for doc, source in comm_docs:
        rows = comm_rows(doc, source)
        c, p, o, notes = bench_points(rows, source)
        comm += c
        phases += p
        overlapped += [(r, source) for r in o]
        model.notes += notes
        model.used += [bench_key(r) for r in rows]
        model.compressors.update({r["compressor"]: row_bits(r) for r in rows if not integer_row(r)})
        model.sources.append(_source(doc, source, "comm", len(rows)))
    krows: list[tuple[dict[str, Any], str]] = []
    tables: list[pd.DataFrame] = []
    for doc, source in kernel_docs:
        rows = kernel_rows(doc, source)
        krows += [(r, source) for r in rows]
        for r in rows:
            if r.get("bits_per_value") is not None:
                model.compressors.setdefault(r["compressor"], float(r["bits_per_value"]))
        model.sources.append(_source(doc, source, "kernels", len(rows)))
    for d in run_dirs:
        table = held_out(run_table(d), hold_out)
        if table.empty:
            raise UserError(
                f"{d}: no completed runs (run.json with status ok) to fit from"
                + (" after --hold-out" if hold_out else "")
            )
        c, p, compute, used = run_points(table, comm_from_runs)
        tables.append(table)
        comm += c
        phases += p
        model.compute += compute
        model.used += used
        model.sources.append({"path": str(d), "kind": "runs", "rows": len(table)})
    if not (comm or krows or model.compute):
        raise UserError(
            "nothing to fit: give a results DIR, --comm FILE.json or --kernels FILE.json"
        )
    model.kernels = _fit_kernels(krows)
    model.phases = _fit_phases(phases)
    if tables:
        runs = pd.concat(tables, ignore_index=True)
        model.imbalance = fit_imbalance(runs)
        model.topologies = fitted_topologies(runs)
        model.solo_comm = fit_solo_comm(runs)
        model.buckets, notes = fit_bucket_profiles(runs)
        model.notes += notes
    model.collectives = fit_collectives(comm)
    extra = _overlap_points(model, overlapped)
    if extra:
        model.collectives = fit_collectives([*comm, *extra])
    if tables and model.buckets:  # needs the collectives: the excess over them is the fit
        model.notes += fit_local_work(model, runs)
    return model


def _source(doc: dict[str, Any], source: str, kind: str, rows: int) -> dict[str, Any]:
    raw = doc.get("machine")
    machine: dict[str, Any] = raw if isinstance(raw, dict) else {}
    keep = ("cpu", "cores", "hostname", "gpus")
    return {
        "path": source, "kind": kind, "rows": rows, "git_commit": doc.get("git_commit"),
        "machine": {k: machine.get(k) for k in keep if k in machine},
        "settings": doc.get("settings"),
    }  # fmt: skip


def _overlap_points(
    model: CostModel, rows: Sequence[tuple[dict[str, Any], str]]
) -> list[CommPoint]:
    """Pipelined rows give their comm as time - fill, where comm bounds the pipeline
    (comm >= encode + decode of the synchronised scheme); other rows say nothing about it."""
    out = []
    for r, source in rows:
        scheme = bench_scheme(r)
        k, s, comp = int(r["world_size"]), int(r["bytes"]), str(r["compressor"])
        try:
            enc, _ = codec_time(model, r["backend"], Scheme(scheme.name), comp, k, s / 4, "encode")
            dec, _ = codec_time(model, r["backend"], Scheme(scheme.name), comp, k, s / 4, "decode")
            spec = bench_compressor(r)
        except UserError:
            model.notes.append(f"{source}: {r['scheme']} {comp}: no codec fit; row not used")
            continue
        comm_s = float(r["time_s"]) - (enc + dec) / scheme.overlap
        if comm_s < enc + dec:
            continue
        item = comm_plan(scheme, spec, k, s / 4, row_bits(r), r["backend"])
        out.append(CommPoint(
            backend=r["backend"], network=r["network"], collective=item.collective,
            world_size=k, msgs=item.msgs, calls=measured_calls(item, r.get("wire_bytes")),
            seconds=comm_s, source=source, scheme=scheme.label, compressor=comp, bytes=s,
        ))  # fmt: skip
    return out
