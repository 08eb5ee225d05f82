"""The training loop of DDP runs: PyTorch's DistributedDataParallel, communication per bucket
during backward (``overlap: backward``), with torch's hooks or qbench's (``qbench.ddp``).

Per iteration it records what ``qbench.ddp.timeline`` measures: the forward pass, backward
compute (until the last bucket is handed over), the exposed communication (from then until
``backward()`` returns: DDP waits there for every bucket), the total communication time and the
share of it hidden behind backward. ``t_encode`` / ``t_decode`` are NaN: a bucket's codec runs on
the communication thread, interleaved with backward, so it has no place in a sum that adds up
to the iteration; their total is ``t_codec_total``. The phases recorded (compute, comm, step)
add up to the iteration.

DDP broadcasts the model's buffers (batch-norm statistics) from rank 0 in every forward, as it
does by default: that time is in ``t_forward``, its bytes are not in ``bytes_sent``.

Every hook is registered wrapped in ``qbench.ddp.finite``, which checks each bucket for NaN and
inf before the hook sees it; after backward the run's policy fails or skips the step
(``qbench.run.nonfinite``; under ``skip`` the ranks' agreement is exposed communication,
``t_comm``). A skipped step has already been exchanged: only the optimizer step is left out.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from qbench import comm
from qbench.catalog import schemes
from qbench.compress import from_spec
from qbench.compress.powersgd import PowerSGD
from qbench.ddp.finite import FiniteHookState, finite_hook
from qbench.ddp.scheme_hook import SchemeHookState, scheme_hook
from qbench.ddp.timeline import overlap_fraction
from qbench.ddp.torch_hooks import TorchHookState, make_state, torch_hook
from qbench.records.schema import buckets_frame
from qbench.run import nonfinite, precision, profile
from qbench.run.loops.training import Training
from qbench.spec.runspec import RunSpec
from qbench.timing import PhaseTimer

_DDP_KEYS = frozenset({schemes.BACKWARD.name, *(p.name for p in schemes.DDP_OPTIONS)})


class DDPRun(Training):
    def __init__(self, spec: RunSpec, cm: comm.Comm) -> None:
        super().__init__(spec, cm)
        self.options = spec.method.scheme.params
        self.state: TorchHookState | SchemeHookState
        if spec.method.scheme.name == schemes.DDP.name:
            self.state = self._torch_state()
            hook: Any = torch_hook
        else:  # the flat scheme per bucket, with its own parameters (overlap, ...)
            own = {k: v for k, v in spec.method.scheme_params.items() if k not in _DDP_KEYS}
            self.state = self._scheme_state(own)
            hook = scheme_hook
        names = {id(p): n for n, p in self.named.items()}
        self.finite = FiniteHookState(self.state, hook, names)  # no NaN or inf handed on
        self.ddp = self._wrap()
        self.guard = nonfinite.Guard(spec.measurement.nonfinite, cm, cm.rank, device=self.device)
        self.grad_bytes = 4 * sum(p.numel() for p in self.named.values())
        self.bucket_rows: list[dict[str, Any]] = []

    def _wrap(self) -> DistributedDataParallel | None:
        """The model in torch's DDP, every bucket through the hook (a replayed run has none)."""
        ddp = DistributedDataParallel(
            self.model,
            device_ids=[self.device] if self.device.type == "cuda" else None,
            bucket_cap_mb=self.options["bucket_cap_mb"],
            gradient_as_bucket_view=self.options["gradient_as_bucket_view"],
        )
        ddp.register_comm_hook(self.finite, finite_hook)
        return ddp

    def _torch_state(self) -> TorchHookState:
        c = from_spec(self.spec.method.compressor)
        params = c.hook_params() if isinstance(c, PowerSGD) else {}
        return make_state(c.name, self.comm, params, self.spec.measurement.seed)

    def _scheme_state(self, scheme_params: dict[str, Any]) -> SchemeHookState:
        by_param = {id(self.named[n]): g.compressor for g in self.groups for n in g.names}
        return SchemeHookState(
            scheme=self.spec.method.scheme.name, comm=self.comm, seed=self.spec.measurement.seed,
            spec_for=lambda p: by_param[id(p)], scheme_params=scheme_params,
        )  # fmt: skip

    def close(self) -> None:
        if isinstance(self.state, SchemeHookState):
            self.state.close()

    def iteration(self, it: int, timer: PhaseTimer) -> None:
        x, y = self.data.batch(it)
        self.comm.bytes_sent = 0
        self.state.reset()
        timer.start()
        profile.phase("forward")
        self.opt.zero_grad()  # as a plain DDP loop does (grads to None)
        with precision.autocast(self.spec.compute.precision, self.device):
            assert self.ddp is not None  # only a replayed run has none, and its own loop
            loss = self.loss_fn(self.ddp(x), y)
        timer.mark("compute")
        forward_end = timer.last_mark
        profile.phase("backward")
        loss.backward()  # DDP communicates each bucket as backward completes it
        timer.mark("comm")
        self._after_backward(it, timer, forward_end, loss.detach())

    def _after_backward(
        self, it: int, timer: PhaseTimer, forward_end: float, loss: torch.Tensor
    ) -> None:
        """The step (unless a NaN or inf skips it) and the iteration's records; ``timer``'s
        last mark is backward's end, every bucket exchanged."""
        backward_end = timer.last_mark
        stepped = self.guard.decide(it, self.finite.take(), timer)  # fail, or all skip
        agree = timer.last_mark - backward_end  # skip: the ranks' agreement, exposed
        profile.phase("step")
        if stepped:
            self._step()
        timer.mark("step")
        profile.phase(None)
        self._losses.append(loss)
        self._record(it, timer, (forward_end, backward_end, agree), skipped=not stepped)
        for row in self.state.timeline.rows(origin=forward_end):
            self.bucket_rows.append({
                "run_id": self.spec.run_id, "rank": self.comm.rank, "iteration": it,
                "warmup": it < self.spec.measurement.warmup, **row,
            })  # fmt: skip

    def _step(self) -> None:
        self.opt.step()
        if self.spec.compute.weight_bits:  # seed 000 section 5.4: the model itself in low precision
            precision.quantize_tensors_(
                self.named.values(), self.spec.compute.weight_bits, self.weight_draws
            )

    def buckets_frame(self) -> Any:
        return buckets_frame(self.bucket_rows)

    def _record(
        self, it: int, timer: PhaseTimer, ends: tuple[float, float, float], skipped: bool
    ) -> None:
        """``ends``: the forward's and backward's ends on the timer's clock, and the seconds the
        ranks then took to agree on a skip (exposed communication, 0 under ``fail``)."""
        forward_end, backward_end, agree = ends
        last = self.state.timeline.last_hand_over()
        if math.isnan(last):  # nothing was communicated (no gradients)
            last = backward_end
        exposed = max(0.0, backward_end - last)
        compute = timer.totals["compute"] + (backward_end - forward_end) - exposed
        total = self.state.timeline.comm_total() + agree
        exposed += agree
        codec = math.nan
        if isinstance(self.state, SchemeHookState):
            codec = self.state.t_encode + self.state.t_decode
        self.rows.append({
            "run_id": self.spec.run_id, "rank": self.comm.rank, "iteration": it,
            "warmup": it < self.spec.measurement.warmup,
            "t_forward": timer.totals["compute"],
            "t_compute": compute,
            "t_encode": math.nan, "t_comm": exposed, "t_decode": math.nan,
            "t_step": timer.totals["step"], "t_iteration": timer.elapsed(),
            "bytes_sent": self.comm.bytes_sent, "payload_bytes": self.state.payload_bytes,
            "grad_bytes": self.grad_bytes, "loss": math.nan,
            "t_comm_total": total, "overlap_fraction": overlap_fraction(exposed, total),
            "t_codec_total": codec, "skipped": float(skipped),
            **(self.state.level_bytes if isinstance(self.state, SchemeHookState) else {}),
        })  # fmt: skip
