"""Predict one configuration's iteration time from a fitted model.

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
from dataclasses import dataclass, replace

import pandas as pd

from qbench.costmodel.codec import codec_time
from qbench.costmodel.config import Config
from qbench.costmodel.formulas import FALLBACK, bandwidth_bps, comm_plan
from qbench.costmodel.model import CollectiveFit, CostModel, compute_fits, imbalance_key, solo_key
from qbench.costmodel.schemes import FP32, Scheme, incompatibility, nominal_bits_per_value
from qbench.errors import UserError


@dataclass(frozen=True, kw_only=True)
class Prediction:
    config: Config
    mode: str
    compute_s: float
    encode_s: float
    comm_s: float
    decode_s: float
    step_s: float
    total_s: float
    wire_bytes: float
    wait_s: float = 0.0
    """The slowest rank's lag (``CostModel.imbalance``), included in ``total_s``."""
    notes: tuple[str, ...] = ()

    @property
    def aggregate_s(self) -> float:
        return self.total_s - self.compute_s - self.step_s


def _bits(model: CostModel, cfg: Config) -> float:
    if cfg.bits_per_value is not None:
        return cfg.bits_per_value
    bits = nominal_bits_per_value(cfg.compressor) or model.compressors.get(cfg.compressor)
    if bits is None:
        raise UserError(
            f"bits per value of {cfg.compressor} unknown: fit on bench data that includes it "
            "or give them"
        )
    return bits


def _collective(
    model: CostModel, backend: str, network: str, key: str
) -> tuple[CollectiveFit, list[str]]:
    """The fit for a collective on a link: the same key (scaled from the nearest rate if
    needed) first, then its fallbacks."""
    want = bandwidth_bps(network)
    tried, notes = [], []
    k: str | None = key
    while k is not None:
        tried.append(k)
        fits = [c for c in model.collectives if c.backend == backend and c.collective == k]
        exact = [c for c in fits if c.network == network]
        chosen = exact[0] if exact else None
        if chosen is None and want is not None:
            chosen = _nearest([c for c in fits if c.bandwidth_bps is not None], want)
        if chosen is not None:
            if k != key:
                notes.append(f"{key} not fitted: {k} parameters stand in")
            if chosen.network != network:
                notes.append(f"{backend} {k} scaled from {chosen.network} to {network}")
            return chosen, notes
        k = FALLBACK.get(k)
    have = sorted({f"{c.backend}/{c.network}/{c.collective}" for c in model.collectives})
    raise UserError(
        f"no fit for {backend} {'/'.join(tried)} usable on {network} links (fitted: "
        f"{', '.join(have) or 'none'}); fit on `qbench bench comm --backend {backend}` data"
        + (" measured unshaped" if want is None else "")
    )


def _nearest(fits: Sequence[CollectiveFit], bps: float) -> CollectiveFit | None:
    """The fit whose link rate is nearest to ``bps`` in log scale."""
    best, best_d = None, math.inf
    for c in fits:
        d = abs(math.log((c.bandwidth_bps or bps) / bps))
        if d < best_d:
            best, best_d = c, d
    return best


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
    scheme = Scheme.parse(cfg.scheme)
    if (why := incompatibility(scheme, cfg.compressor)) is not None:
        raise UserError(why)
    k = cfg.world_size
    if k < 1:
        raise UserError(f"world size must be >= 1, got {k}")
    numel = _numel(model, cfg)
    compute, step, batch, shared = _compute(model, cfg, numel)
    notes: list[str] = []
    groups = [(cfg.compressor, numel - cfg.fp32_numel)]
    if cfg.fp32_numel > 0 and cfg.compressor != FP32:
        groups.append((FP32, cfg.fp32_numel))
    enc = dec = comm = wire = 0.0
    for comp, n in groups:
        if n <= 0:
            continue
        bits = _bits(model, cfg) if comp == cfg.compressor else 32.0
        for op in ("encode", "decode"):
            t, why_ = codec_time(model, cfg.backend, scheme, comp, k, n, op, cfg.device)
            notes += why_
            if op == "encode":
                enc += t
            else:
                dec += t
        if k > 1:
            item = comm_plan(scheme, comp, k, n, bits, cfg.backend)
            coll, why_ = _collective(model, cfg.backend, cfg.network, item.collective)
            notes += why_
            comm += coll.time(item.msgs, item.calls, cfg.network, cfg.tbf_burst)
            wire += item.wire
    if k == 1:
        comm = model.solo_comm.get(solo_key(cfg.backend, scheme.label, cfg.workload), 0.0)
    cpu = max(1.0, k / cfg.host_cores) if cfg.host_cores else 1.0
    if not shared:
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
        total_s=compute + agg + step + wait, wire_bytes=wire, wait_s=wait,
        notes=tuple(dict.fromkeys(notes)),
    )  # fmt: skip


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
    *("speedup_vs_fp32", "scalability", "samples_per_s", "notes"),
)


def predict_frame(model: CostModel, configs: Sequence[Config]) -> pd.DataFrame:
    """Predictions as a table, with the speedup over fp32 allreduce (same backend, link, K,
    size and compute) and the scalability (K t(1) / t(K): throughput at K ranks over 1 rank of
    the same configuration, per-rank batch fixed)."""
    rows = []
    for cfg in configs:
        p = predict(model, cfg)
        base = predict(model, replace(cfg, scheme="allreduce", compressor=FP32, bits_per_value=None,
                                      fp32_numel=0))  # fmt: skip
        one = predict(model, replace(cfg, world_size=1))
        c = p.config
        batch = c.batch_size or 1
        rows.append({
            "backend": c.backend, "network": c.network, "world_size": c.world_size,
            "numel": c.numel, "workload": c.workload or "", "scheme": Scheme.parse(c.scheme).label,
            "compressor": c.compressor, "mode": p.mode, "compute_s": p.compute_s,
            "encode_s": p.encode_s, "comm_s": p.comm_s, "decode_s": p.decode_s,
            "step_s": p.step_s, "wait_s": p.wait_s, "total_s": p.total_s,
            "wire_bytes": p.wire_bytes,
            "speedup_vs_fp32": base.total_s / p.total_s if p.total_s > 0 else math.nan,
            "scalability": c.world_size * one.total_s / p.total_s if p.total_s > 0 else math.nan,
            "samples_per_s": c.world_size * batch / p.total_s if p.total_s > 0 else math.nan,
            "notes": "; ".join(p.notes),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS))
