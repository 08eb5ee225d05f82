"""Predict one configuration's iteration time from a fitted model.

DDP configurations (``ddp``, schemes with ``backward: true``, or ``Config.overlap = backward``)
go to ``qbench.costmodel.overlap``; the formulas below are those of one flat gradient after
backward.

**Iteration:** ``total = (compute + encode + comm + decode + step) * imbalance``. Pipelined
schemes (``overlap: C``): ``total = compute + max(encode + decode, comm) + (encode + decode) / C
+ step``, the last term being the pipeline's fill and drain (first chunk's encode, last chunk's
decode) and comm paying C times the messages. ``lowprec-allreduce`` is the *projected* NCCL
with native low-precision reduction: one allreduce of the compressed bytes (bits / 32 of fp32)
on the fp32 allreduce's alpha and beta, one encode and one decode of n values, no decode /
re-encode in the middle.

**Imbalance:** the fitted ratio at K multiplies the sum, the difference shown as ``wait``; a K
without runs takes the nearest fitted K's ratio (log scale, the larger on ties).

**Compute:** a world size the runs had, on a host with the same core count, takes that world
size's medians (CPU sharing already in them); others the per-rank medians. Fits assume at most
one rank per core (true of the bench runs they come from); with ``host_cores`` (K ranks
emulated on one host) compute and codec times are multiplied by max(1, K / host_cores).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pandas as pd

from qbench.catalog import CompressorSpec
from qbench.costmodel import levels
from qbench.costmodel.config import Config, Prediction
from qbench.costmodel.formulas import traffic
from qbench.costmodel.model import CostModel, compute_fits, imbalance_key, solo_key
from qbench.costmodel.overlap import predict_backward
from qbench.costmodel.phases import codec_time, collective_fit, wire_bits
from qbench.costmodel.schemes import ALLREDUCE, DDP, NONE, Scheme, full_precision, incompatibility
from qbench.errors import UserError


def _compute(model: CostModel, cfg: Config, numel: int) -> tuple[float, float, int | None, bool]:
    """(compute, step, batch size, shared) of a configuration: given, or from the workload's
    fit, measured at the same world size on a like host where it can (``shared``: CPU sharing
    already in the times), else per rank on a core of its own."""
    fit_ = None
    if cfg.workload is not None:
        cands = [c for c in compute_fits(model, cfg.workload) if c.device == cfg.device]
        if cfg.batch_size is not None:
            cands = [c for c in cands if c.batch_size == cfg.batch_size]
        if len({c.batch_size for c in cands}) > 1:
            sizes = ", ".join(str(b) for b in sorted({c.batch_size for c in cands}))
            raise UserError(f"{cfg.workload}: fitted at batch sizes {sizes}; pick one")
        if cands:
            fit_ = cands[0]
        elif cfg.compute_s is None:
            have = sorted({f"{c.workload}@{c.batch_size}" for c in model.compute})
            raise UserError(
                f"no compute fit for {cfg.workload} (batch {cfg.batch_size}, {cfg.device}); "
                f"fitted: {', '.join(have) or 'none'}; give the compute time instead"
            )
    given = cfg.compute_s is not None or cfg.step_s is not None
    at_k = fit_.at(cfg.world_size, cfg.host_cores) if fit_ is not None and not given else None
    if cfg.compute_s is not None:
        compute = cfg.compute_s
    elif fit_ is None:
        compute = 0.0
    else:
        compute = at_k[0] if at_k is not None else fit_.compute_s
    if cfg.step_s is not None:
        step = cfg.step_s
    elif fit_ is None:
        step = 0.0
    else:
        per = at_k[1] / max(fit_.numel, 1) if at_k is not None else fit_.step_s_per_element
        step = per * numel
    return compute, step, fit_.batch_size if fit_ else cfg.batch_size, at_k is not None


def _numel(model: CostModel, cfg: Config) -> int:
    if cfg.numel is not None:
        return cfg.numel
    for c in compute_fits(model, cfg.workload or ""):
        return c.numel
    raise UserError("gradient size unknown: give the model's element count (e.g. 61M)")


def predict(model: CostModel, cfg: Config) -> Prediction:
    """Iteration time breakdown of one configuration (formulas in the module docstring)."""
    scheme = cfg.scheme.per_bucket(cfg.overlap)
    if (why := incompatibility(scheme, cfg.compressor)) is not None:
        raise UserError(why)
    if cfg.topology is not None:
        cfg = replace(cfg, world_size=cfg.topology.world_size, network=cfg.topology.inter)
    k = cfg.world_size
    if k < 1:
        raise UserError(f"world size must be >= 1, got {k}")
    if scheme.backward:
        return predict_backward(model, cfg, scheme)
    numel = _numel(model, cfg)
    compute, step, batch, shared = _compute(model, cfg, numel)
    notes: list[str] = _extrapolated(model, cfg)
    groups = [(cfg.compressor, numel - cfg.fp32_numel)]
    if cfg.fp32_numel > 0 and not full_precision(cfg.compressor):
        groups.append((NONE, cfg.fp32_numel))
    enc = dec = comm = wire = 0.0
    for comp, n in groups:
        if n <= 0:
            continue
        bits = wire_bits(model, cfg) if comp == cfg.compressor else 32.0
        for op in ("encode", "decode"):
            t, why_ = _codec(model, cfg, scheme, comp.label, n, op)
            notes += why_
            if op == "encode":
                enc += t
            else:
                dec += t
        if k > 1:
            t, w, why_ = _comm(model, cfg, scheme, comp, n, bits)
            notes += why_
            comm, wire = comm + t, wire + w
    if k == 1:
        comm = model.solo_comm.get(solo_key(cfg.backend, scheme.label, cfg.workload), 0.0)
    cpu = max(1.0, k / cfg.host_cores) if cfg.host_cores else 1.0
    if not shared and not cfg.replayed_compute:  # replayed compute sleeps: no core to share
        compute, step = compute * cpu, step * cpu
    enc, dec = enc * cpu, dec * cpu
    if scheme.overlap > 1:
        agg = max(enc + dec, comm) + (enc + dec) / scheme.overlap
    else:
        agg = enc + comm + dec
    ratio, why_ = _lag(model, cfg.backend, scheme, k)
    notes += why_
    wait = (ratio - 1) * (compute + agg + step)
    return Prediction(
        config=replace(cfg, numel=numel, batch_size=batch), mode=scheme.mode,
        compute_s=compute, encode_s=enc, comm_s=comm, decode_s=dec, step_s=step,
        total_s=compute + agg + step + wait, wire_bytes=wire, wait_s=wait, comm_total_s=comm,
        codec_total_s=enc + dec, notes=tuple(dict.fromkeys(notes)),
    )  # fmt: skip


def _comm(
    model: CostModel, cfg: Config, scheme: Scheme, comp: CompressorSpec, n: float, bits: float
) -> tuple[float, float, list[str]]:
    """(seconds, wire bytes, notes) of the comm phase of the scheme's declared traffic: on one
    link, or on the configuration's two levels (``qbench.costmodel.levels``)."""
    topo = levels.topology(cfg)
    plan = traffic(scheme, comp, cfg.world_size, n, bits, cfg.backend, topo.nodes)
    if plan.levelled or cfg.topology is not None:
        got = levels.comm(model, cfg, plan)
        return got.seconds, got.wire, list(got.notes)
    seconds, notes = 0.0, list[str]()
    for phase in plan.phases:
        coll, why = collective_fit(model, cfg.backend, cfg.network, phase.collective)
        seconds += coll.time(phase.msgs, phase.calls, cfg.network, cfg.tbf_burst)
        notes += why
    return seconds, plan.wire, notes


def _extrapolated(model: CostModel, cfg: Config) -> list[str]:
    """A note when the configuration's nodes x ranks per node is not one the model was fitted
    on: its two levels come from other topologies."""
    topo = cfg.topology
    if topo is None or f"{topo.nodes}x{topo.ranks_per_node}" in model.topologies:
        return []
    fitted = ", ".join(model.topologies) or "none (one-level runs only)"
    return [
        f"{topo.nodes} nodes x {topo.ranks_per_node} ranks: extrapolated beyond the fitted "
        f"topologies ({fitted}) by the two-level formulas"
    ]


def _codec(
    model: CostModel, cfg: Config, scheme: Scheme, comp: str, n: float, op: str
) -> tuple[float, list[str]]:
    nodes = levels.topology(cfg).nodes
    return codec_time(model, cfg.backend, scheme, comp, cfg.world_size, n, op, cfg.device, nodes)


def _lag(model: CostModel, backend: str, scheme: Scheme, k: int) -> tuple[float, list[str]]:
    """The imbalance ratio for K ranks: fitted at K, else at the nearest fitted K (log scale,
    the larger on ties), else 1."""
    if k < 2 or scheme.overlap > 1 or not model.imbalance:
        return 1.0, []
    got = model.imbalance.get(imbalance_key(backend, scheme.label, k))
    if got is not None:
        return got, []
    split = (key.rsplit("/", 2) for key in model.imbalance)
    ks = [int(j) for b, name, j in split if (b, name) == (backend, scheme.label)]
    if not ks:
        return 1.0, []
    near = min(ks, key=lambda j: (abs(math.log(j / k)), -j))
    return model.imbalance[imbalance_key(backend, scheme.label, near)], [
        f"{backend} {scheme.label} imbalance at {k} ranks taken from {near}"
    ]


PREDICTION_COLUMNS = (
    *("backend", "network", "world_size", "numel", "workload", "scheme", "compressor", "mode"),
    *("compute_s", "encode_s", "comm_s", "decode_s", "step_s", "wait_s", "total_s", "wire_bytes"),
    *("comm_total_s", "codec_total_s", "speedup_vs_fp32", "speedup_vs_ddp", "scalability"),
    *("samples_per_s", "notes"),
)


def predict_frame(model: CostModel, configs: Sequence[Config]) -> pd.DataFrame:
    """Predictions as a table, with the speedup over fp32 allreduce (same backend, link, K,
    size and compute), over DDP fp32 (where the workload has a bucket profile; else NaN) and the
    scalability (K t(1) / t(K): throughput at K ranks over 1 rank of the same configuration,
    per-rank batch fixed)."""
    rows = []
    for cfg in configs:
        p = predict(model, cfg)
        fp32 = replace(cfg, compressor=NONE, bits_per_value=None, fp32_numel=0, overlap=None)
        base = predict(model, replace(fp32, scheme=ALLREDUCE))
        try:
            ddp: float = predict(model, replace(fp32, scheme=Scheme(DDP))).total_s
        except UserError:
            ddp = math.nan
        one = predict(model, replace(cfg, world_size=1, topology=None))
        c = p.config
        label = c.scheme.per_bucket(c.overlap).label
        batch = c.batch_size or 1
        rows.append({
            "backend": c.backend, "network": c.network.label, "world_size": c.world_size,
            "numel": c.numel, "workload": c.workload or "", "scheme": label,
            "compressor": c.compressor.label, "mode": p.mode, "compute_s": p.compute_s,
            "encode_s": p.encode_s, "comm_s": p.comm_s, "decode_s": p.decode_s,
            "step_s": p.step_s, "wait_s": p.wait_s, "total_s": p.total_s,
            "wire_bytes": p.wire_bytes, "comm_total_s": p.comm_total_s,
            "codec_total_s": p.codec_total_s,
            "speedup_vs_fp32": base.total_s / p.total_s if p.total_s > 0 else math.nan,
            "speedup_vs_ddp": ddp / p.total_s if p.total_s > 0 else math.nan,
            "scalability": c.world_size * one.total_s / p.total_s if p.total_s > 0 else math.nan,
            "samples_per_s": c.world_size * batch / p.total_s if p.total_s > 0 else math.nan,
            "notes": "; ".join(p.notes),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS))
