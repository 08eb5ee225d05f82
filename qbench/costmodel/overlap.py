"""Overlap-aware iteration time of DDP runs (``overlap: backward``), after Agarwal et al., "On the
Utility of Gradient Compression in Distributed Training Systems" (MLSys 2022).

DDP hands bucket i over when backward has computed its last gradient, at ``h_i`` seconds after
backward started (the workload's ``BucketProfile``, measured once per model). The buckets go
through one communication stream in order, so bucket i starts when it is handed over and the
previous one is done, and takes its encode, collective and decode::

    start_i = max(h_i, end_{i-1}),   end_i = start_i + encode_i + collective_i + decode_i
    exposed = max(0, end_last - h_last)          (h_last: the last hand-over)
    iteration = (forward + backward + exposed + step) * imbalance

* torch's hooks (``ddp``): fp32 is a ring allreduce of 4 n bytes per bucket of n values
  (collective ``allreduce``), fp16 / bf16 of 2 n bytes (``allreduce-fp16`` / ``-bf16``), with the
  flat allreduce's codec fits for the divide and the casts; PowerSGD is two allreduces (P, Q) of
  half its measured per-bucket payload each, so it needs one PowerSGD run of the model; its
  local work (matrix products, orthogonalisation, on CPU their contention with backward) is
  the fitted runs' excess over these collectives (``qbench.costmodel.powersgd``), added to the
  exposed communication.
* qbench's hooks (``reduce-broadcast+backward`` ...): each bucket is the flat scheme's exchange
  of n values, ``comm_plan(scheme, compressor, K, n)`` and the codec fits with n per bucket;
  values the layer policy keeps in fp32 are taken as the same share of every bucket, exchanged
  after the compressed ones.
* Collectives use the alpha-beta fits (beta scaled to other link rates); compute and codec times
  scale with CPU sharing as in ``qbench.costmodel.predict`` (the profile's times by
  max(1, K / cores) at the prediction over the same at the profile).
* ``imbalance`` is the profile's own ratio (slowest rank over the rank means of the DDP run),
  not the flat model's per-scheme ratio: one DDP run of the model is all there is.

Reported like the runs: ``comm`` is the exposed part, ``comm_total`` the time with at least one
bucket between hand-over and ready, ``codec_total`` the encode + decode of all buckets; encode
and decode alone are NaN, since they run beside backward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from qbench.catalog.schemes import DEFAULT_BUCKET_CAP_MB
from qbench.costmodel.config import Config, Prediction
from qbench.costmodel.formulas import CommItem, allreduce_wire, collective_msgs, comm_plan
from qbench.costmodel.model import BucketProfile, CostModel
from qbench.costmodel.phases import codec_time, collective_fit, wire_bits
from qbench.costmodel.schemes import (
    DDP,
    FP32,
    NONE,
    Scheme,
    full_precision,
    is_powersgd,
    is_torch_hook,
)
from qbench.ddp.timeline import union_length
from qbench.errors import UserError


def timeline(handed: Sequence[float], seconds: Sequence[float]) -> list[tuple[float, float]]:
    """(start, end) of each bucket on one communication stream, in hand-over order."""
    spans: list[tuple[float, float]] = []
    end = -math.inf
    for h, d in zip(handed, seconds, strict=True):
        start = max(h, end)
        end = start + d
        spans.append((start, end))
    return spans


def exposed(handed: Sequence[float], spans: Sequence[tuple[float, float]]) -> float:
    """Communication the loop waits for after backward's last hand-over."""
    return max(0.0, spans[-1][1] - max(handed)) if spans else 0.0


def predict_backward(
    model: CostModel, cfg: Config, scheme: Scheme, *, local: bool = True
) -> Prediction:
    """One DDP iteration of ``cfg`` (formulas in the module docstring); ``local=False`` leaves
    out PowerSGD's fitted local work (to fit it)."""
    for name, given in (("compute_s", cfg.compute_s), ("step_s", cfg.step_s)):
        if given is not None:
            raise UserError(f"{name} does not apply to DDP: its bucket profile has the times")
    prof, notes = bucket_profile(model, cfg, scheme)
    numel = sum(prof.numel)
    if cfg.numel is not None and cfg.numel != numel:
        raise UserError(
            f"{prof.workload}'s DDP buckets hold {numel:,} values, not {cfg.numel:,}: "
            "DDP predictions use the measured model's buckets"
        )
    k = cfg.world_size
    cpu = cpu_share(k, cfg.host_cores)
    scale = cpu / cpu_share(prof.world_size, prof.host_cores)
    handed = [h * scale for h in prof.handed_s]
    busy, wire, codec = [], 0.0, 0.0
    for i, n in enumerate(prof.numel):
        enc, coll, dec, w, why = _bucket(model, cfg, scheme, prof, i, n / numel)
        notes += why
        busy.append(coll + (enc + dec) * cpu)
        wire += w
        codec += (enc + dec) * cpu
    spans = timeline(handed, busy)
    waited = exposed(handed, spans)
    if local and is_powersgd(cfg.compressor):
        extra, why = _local_work(prof, cfg.compressor.label)
        waited, codec, notes = waited + extra * cpu, codec + extra * cpu, notes + why
    compute = (prof.forward_s + prof.backward_s) * scale
    step = prof.step_s * scale
    wait = (prof.imbalance - 1) * (compute + waited + step)
    return Prediction(
        config=replace(cfg, numel=numel, batch_size=prof.batch_size), mode=scheme.mode,
        compute_s=compute, encode_s=math.nan, comm_s=waited, decode_s=math.nan,
        step_s=step, total_s=compute + waited + step + wait, wire_bytes=wire, wait_s=wait,
        comm_total_s=union_length([(h, e) for h, (_, e) in zip(handed, spans, strict=True)]),
        codec_total_s=codec, notes=tuple(dict.fromkeys(notes)),
    )  # fmt: skip


def _local_work(prof: BucketProfile, label: str) -> tuple[float, list[str]]:
    """PowerSGD's fitted local work per iteration (on a core of its own), with a note."""
    if label not in prof.local_s:
        return 0.0, [f"{label}: no fitted run of it on {prof.workload}; its local matrix "
                     "products are not modelled"]  # fmt: skip
    return prof.local_s[label], [
        f"{label}: local work {prof.local_s[label] * 1e3:.3g} ms per iteration, fitted"
    ]


def cpu_share(k: int, cores: int | None) -> float:
    """How much slower CPU work runs with K ranks on ``cores`` cores than on a core each."""
    return max(1.0, k / cores) if cores else 1.0


def _bucket(
    model: CostModel, cfg: Config, scheme: Scheme, prof: BucketProfile, i: int, share: float
) -> tuple[float, float, float, float, list[str]]:
    """(encode, collective, decode, wire bytes, notes) of bucket i (``share``: its part of the
    gradient, for the layer policy's fp32 values)."""
    n, k = prof.numel[i], cfg.world_size
    if is_powersgd(cfg.compressor):
        return _powersgd(model, cfg, prof, i)
    groups = [(cfg.compressor, n - cfg.fp32_numel * share)]
    fp32_too = not (full_precision(cfg.compressor) or is_torch_hook(cfg.compressor))
    if cfg.fp32_numel > 0 and fp32_too:
        groups.append((NONE, cfg.fp32_numel * share))
    flat = scheme.exchange
    enc = coll = dec = wire = 0.0
    notes: list[str] = []
    for comp, m in groups:
        if m <= 0:
            continue
        e, why_e = codec_time(model, cfg.backend, flat, comp.label, k, m, "encode", cfg.device)
        d, why_d = codec_time(model, cfg.backend, flat, comp.label, k, m, "decode", cfg.device)
        enc, dec, notes = enc + e, dec + d, notes + why_e + why_d
        if k > 1:
            bits = wire_bits(model, cfg) if comp == cfg.compressor else 32.0
            item = comm_plan(flat, comp, k, m, bits, cfg.backend)
            t, why = _collective(model, cfg, item)
            coll, wire, notes = coll + t, wire + item.wire, notes + why
    return enc, coll, dec, wire, notes


def _powersgd(
    model: CostModel, cfg: Config, prof: BucketProfile, i: int
) -> tuple[float, float, float, float, list[str]]:
    """``_bucket`` under torch's PowerSGD hook: allreduces of P and Q, half of its measured
    payload each; its local work is per iteration (``_local_work``), not per bucket."""
    payloads = prof.payload_bytes.get(cfg.compressor.label)
    if payloads is None:
        have = ", ".join(sorted(prof.payload_bytes)) or "none"
        raise UserError(
            f"{cfg.compressor.label}: its payload depends on {prof.workload}'s matrices and no "
            f"DDP run of it measured them (measured: {have}); run `scheme: ddp` with that "
            "compressor once"
        )
    k = cfg.world_size
    if k < 2:
        return 0.0, 0.0, 0.0, 0.0, []
    half = allreduce_wire(payloads[i] / 2, k)
    item = CommItem("allreduce", 2 * collective_msgs("allreduce", k), (half, half))
    t, why = _collective(model, cfg, item)
    return 0.0, t, 0.0, item.wire, why


def _collective(model: CostModel, cfg: Config, item: CommItem) -> tuple[float, list[str]]:
    fit, notes = collective_fit(model, cfg.backend, cfg.network, item.collective)
    return fit.time(item.msgs, item.calls, cfg.network, cfg.tbf_burst), notes


def bucket_profile(
    model: CostModel, cfg: Config, scheme: Scheme
) -> tuple[BucketProfile, list[str]]:
    """The workload's profile at this device, batch size and bucket cap: at the world size, else
    at the nearest measured one (log scale, the larger on ties)."""
    cap = scheme.bucket_cap_mb or DEFAULT_BUCKET_CAP_MB
    have = sorted({f"{b.workload}@{b.batch_size}/{b.bucket_cap_mb:g}MB" for b in model.buckets})
    cands = [
        b for b in profiles_of(model, cfg.workload or "")
        if b.device == cfg.device and b.bucket_cap_mb == cap
        and cfg.batch_size in (None, b.batch_size)
    ]  # fmt: skip
    if not cands:
        raise UserError(
            f"no DDP bucket profile for {cfg.workload or 'the workload (give --model NAME)'} "
            f"(batch {cfg.batch_size}, {cfg.device}, bucket cap {cap:g} MB); measured: "
            f"{', '.join(have) or 'none'}; fit on results with a `scheme: ddp` run of it"
        )
    if len({b.batch_size for b in cands}) > 1:
        sizes = ", ".join(str(b) for b in sorted({b.batch_size for b in cands}))
        raise UserError(f"{cfg.workload}: DDP buckets measured at batch sizes {sizes}; pick one")
    k = cfg.world_size
    prof = min(cands, key=lambda b: (abs(math.log(b.world_size / k)), -b.world_size))
    notes = [] if prof.world_size == k else [
        f"{prof.workload} DDP buckets at {k} ranks taken from {prof.world_size}"
    ]  # fmt: skip
    if prof.measured.split()[:2] != [DDP, FP32]:
        notes.append(f"{prof.workload} DDP buckets timed on {prof.measured} runs")
    return prof, notes


def profiles_of(model: CostModel, workload: str) -> list[BucketProfile]:
    """Profiles of a workload: by its full name, else by model name when only one has it."""
    exact = [b for b in model.buckets if b.workload == workload]
    if exact:
        return exact
    named = [b for b in model.buckets if b.workload.split("(")[0] == workload]
    return named if len({b.workload for b in named}) == 1 else []
