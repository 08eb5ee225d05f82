"""The flat training loop (``Run``): the model's parameters and gradients live in one flat
buffer each; after backward, each layer group's compressor and the scheme's aggregator exchange
slices of it. DDP's loop (buckets during backward) is ``qbench.run.loops.ddp``; a rank's lifecycle
around either is ``qbench.run.lifecycle``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from qbench import aggregate, comm
from qbench.compress import Compressor, from_spec
from qbench.run import async_ps, nonfinite, precision, profile
from qbench.run.loops.training import Training
from qbench.run.telemetry import Telemetry
from qbench.spec.runspec import RunSpec
from qbench.timing import PhaseTimer


def _flatten(params: list[nn.Parameter]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat parameter and gradient buffers in the given order (group by group, see
    qbench.spec.layers); every parameter and its .grad become views into them, so schemes read and
    write whole slices with no copy per step."""
    numel = sum(p.numel() for p in params)
    flat_p = torch.empty(numel, dtype=torch.float32, device=params[0].device)
    flat_g = torch.zeros_like(flat_p)
    pos = 0
    for p in params:
        flat_p[pos : pos + p.numel()].copy_(p.detach().reshape(-1))
        p.data = flat_p[pos : pos + p.numel()].view_as(p)
        p.grad = flat_g[pos : pos + p.numel()].view_as(p)
        pos += p.numel()
    return flat_p, flat_g


def _flat_model(t: Training) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The model's parameters and gradients as flat buffers in layer-group order, and each
    parameter's size (for weights: {bits: N})."""
    ordered = [t.named[n] for g in t.groups for n in g.names]
    params, grads = _flatten(ordered)
    return params, grads, [p.numel() for p in ordered]


def _slices(t: Training) -> list[tuple[str, slice]]:
    """Each parameter's name and slice of the flat buffers (layer-group order, as _flat_model)."""
    out, pos = [], 0
    for n in (n for g in t.groups for n in g.names):
        out.append((n, slice(pos, pos + t.named[n].numel())))
        pos += t.named[n].numel()
    return out


def _guard(t: Training, cm: comm.Comm | None) -> nonfinite.Guard:
    """The run's non-finite policy over the flat gradient; ``cm``: the ranks that agree on a
    skip (None: this rank alone)."""
    return nonfinite.Guard(t.spec.measurement.nonfinite, cm, t.comm.rank, _slices(t), t.device)


def _group_compressors(t: Training) -> Iterator[tuple[slice, Compressor, tuple[int, ...]]]:
    """Each layer group's slice of the flat buffers, its compressor (built as consumed) and the
    sizes of its tensors (per-tensor compressors encode each on its own)."""
    pos = 0
    for g in t.groups:
        yield (
            slice(pos, pos + g.numel),
            from_spec(g.compressor, seed=t.spec.measurement.seed),
            g.sizes,
        )
        pos += g.numel


class Run(Training):
    """Flat aggregation (what the seeds measured): backward runs to the end, then each layer
    group's slice of one flat gradient buffer goes through the scheme."""

    def __init__(self, spec: RunSpec, cm: comm.Comm) -> None:
        super().__init__(spec, cm)
        self.params, self.flat, self.sizes = _flat_model(self)
        self.aggs = self._aggregators()
        for part, agg in self.aggs:
            agg.begin(self.params[part])  # local SGD, DiLoCo: the global model starts here
        self.telemetry = self._telemetry(self.named) if spec.measurement.telemetry else None
        self.guard = _guard(self, cm)

    def _aggregators(self) -> list[tuple[slice, aggregate.Aggregator]]:
        scheme, params = self.spec.method.scheme.name, self.spec.method.scheme_params
        out = []
        for part, c, sizes in _group_compressors(self):  # each compressor then its aggregator
            numel = part.stop - part.start
            c = self._codec(c)
            agg = aggregate.build(
                scheme, self.comm, c, numel, offset=part.start, params=params, tensors=sizes
            )
            out.append((part, agg))
        return out

    def _codec(self, compressor: Compressor) -> Compressor:
        """The compressor the scheme calls (replayed runs may time its calls differently)."""
        return compressor

    def after(self, it: int) -> None:
        """Outside the timed iteration: late bytes go to their records and, after the last
        step, what is still in flight ends (Streaming DiLoCo's exchanges), before the epoch's
        evaluation sees the model."""
        if it == self.total_iterations - 1:
            for part, agg in self.aggs:
                agg.finish(self.params[part])
        self._settle()
        super().after(it)

    def _settle(self) -> None:
        """Bytes of exchanges that ran behind the loop, into the records of the steps that
        started them (already written: those steps are over)."""
        for _, agg in self.aggs:
            for step, sent, payload in agg.late:
                row = next(r for r in reversed(self.rows) if r["iteration"] == step)
                row["bytes_sent"] += sent
                row["payload_bytes"] += payload
            agg.late.clear()

    def close(self) -> None:
        for _, agg in self.aggs:
            agg.close()

    def _telemetry(self, named: dict[str, nn.Parameter]) -> Telemetry:
        entries, pos = [], 0
        for g in self.groups:
            for n in g.names:
                entries.append((n, slice(pos, pos + named[n].numel()), g.compressor))
                pos += named[n].numel()
        make = lambda c: from_spec(c, seed=self.spec.measurement.seed)  # noqa: E731
        return Telemetry(entries, make, self.spec.run_id, self.comm.rank)

    def iteration(self, it: int, timer: PhaseTimer) -> None:
        x, y = self.data.batch(it)
        self.comm.bytes_sent = 0
        timer.start()
        profile.phase("forward")
        self.flat.zero_()
        with precision.autocast(self.spec.compute.precision, self.device):
            loss = self.loss_fn(self.model(x), y)
        profile.phase("backward")
        (loss * self.scaler.scale if self.scaler.enabled else loss).backward()
        # fp16 overflow: this rank contributes nothing this step (the others go on, so no
        # collective is skipped and no rank waits), and its loss scale halves.
        nonfinite.unscale(self.scaler, self.flat)
        timer.mark("compute")
        profile.phase(None)  # encode / comm / decode: ranges of their own
        stepped = self.guard.check(it, self.flat, timer)  # a NaN or inf: fail, or all skip
        if stepped:
            self._step(it, timer)
        self._losses.append(loss.detach())
        self._record(it, timer, skipped=not stepped)

    def _step(self, it: int, timer: PhaseTimer) -> None:
        """The scheme's exchange, the optimizer step and the model mixing of one iteration."""
        grad = None
        if self.telemetry is not None:
            grad = self.flat.clone()  # for the telemetry pass; not part of training
            timer.skip()
        for part, agg in self.aggs:
            view = self.flat[part]
            mean = agg.aggregate(view, it, timer)
            if mean.data_ptr() != view.data_ptr():
                view.copy_(mean)
        profile.phase("step")
        self._optimizer_step()
        timer.mark("step")
        profile.phase(None)
        for part, agg in self.aggs:
            agg.after_step(self.params[part], it, timer)  # decentralized schemes mix models
        if self.telemetry is not None and grad is not None:  # after the last mark: not timed
            self.telemetry.observe(it, grad)

    def _optimizer_step(self) -> None:
        self.opt.step()
        if self.spec.compute.weight_bits:  # seed 000 section 5.4: the model itself in low precision
            precision.quantize_weights_(
                self.params, self.sizes, self.spec.compute.weight_bits, self.weight_draws
            )

    def _record(self, it: int, timer: PhaseTimer, skipped: bool = False) -> None:
        t = dict(timer.totals)
        # After backward, every second of communication is exposed, but for exchanges that ran
        # behind the loop (Streaming DiLoCo's helper) until this step waited for them.
        behind = sum(agg.hidden_s for _, agg in self.aggs)
        comm_total = t["comm"] + behind
        hidden = behind / comm_total if comm_total > 0 else 0.0
        if any(agg.overlapped for _, agg in self.aggs):
            # Overlapped mode: phases interleave, so per-phase times would be made up.
            t.update(encode=float("nan"), comm=float("nan"), decode=float("nan"))
            comm_total = hidden = float("nan")
        self.rows.append(
            {
                "run_id": self.spec.run_id,
                "rank": self.comm.rank,
                "iteration": it,
                "warmup": it < self.spec.measurement.warmup,
                **{f"t_{k}": v for k, v in t.items()},
                "t_iteration": timer.elapsed(),
                "bytes_sent": self.comm.bytes_sent,
                "payload_bytes": 0 if skipped else sum(agg.payload_bytes for _, agg in self.aggs),
                "grad_bytes": 4 * self.flat.numel(),
                "loss": float("nan"),
                "t_comm_total": comm_total,
                "overlap_fraction": hidden,
                "skipped": float(skipped),
                **self._scheme_metrics(),
            }
        )

    def _scheme_metrics(self) -> dict[str, float]:
        """Per-iteration measurements a scheme offers. Each scheme instance covers one slice of
        the parameters: gossip reports this rank's squared distance to the mean model per slice
        (``consensus_sq``), combined over slices and ranks into ``consensus_distance``."""
        from qbench.aggregate.gossip import consensus_distance
        from qbench.aggregate.hierarchical import LEVEL_BYTES

        out: dict[str, float] = {}
        squares: list[float] = []
        for _, agg in self.aggs:
            m = dict(agg.metrics())
            if "consensus_sq" in m:
                squares.append(m.pop("consensus_sq"))
            for k, v in m.items():  # bytes per level (hierarchical) add up over the slices
                out[k] = out.get(k, 0.0) + v if k in LEVEL_BYTES else v
        if squares:
            out["consensus_distance"] = consensus_distance(self.comm, squares, self.device)
        return out


def async_parts(t: Training) -> async_ps.AsyncParts:
    """What the asynchronous parameter server uses of a rank's set-up: the model as flat
    buffers, each layer group's compressor and the scheme's parameters; the loop is its own."""
    params, grads, sizes = _flat_model(t)
    scheme = t.spec.method.scheme.params
    return async_ps.AsyncParts(
        spec=t.spec, comm=t.comm, device=t.device, model=t.model, params=params, grads=grads,
        sizes=sizes, groups=list(_group_compressors(t)), scheme=async_ps.AsyncParams(**scheme),
        data=t.data, loss_fn=t.loss_fn, scaler=t.scaler, epoch_data=t.epoch_data, rows=t.rows,
        epoch_rows=t.epoch_rows, guard=_guard(t, None),
    )  # fmt: skip
