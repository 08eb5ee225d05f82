"""An async-ps worker rank, the server's client (ranks 1..K-1): pull the (quantized) model,
compute a gradient on the next batch, encode it per layer group and push it, until the server
says stop. Overview: :mod:`qbench.run.async_ps`."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from qbench.comm.base import Comm
from qbench.run import nonfinite, precision
from qbench.run.async_ps.parts import SERVER, AsyncParts
from qbench.run.async_ps.protocol import (
    HEADER,
    PAYLOAD,
    Push,
    Reply,
    codecs,
    decode_model,
    send_message,
)
from qbench.timing import PhaseTimer


def _delay(rank: int) -> float:
    """QBENCH_ASYNC_DELAY=RANK:SECONDS makes that worker sleep this long per gradient (a slow
    worker), to test that it does not stall the others. Testing only."""
    got = os.environ.get("QBENCH_ASYNC_DELAY", "")
    who, _, seconds = got.partition(":")
    return float(seconds) if who and int(who) == rank else 0.0


def work(r: AsyncParts) -> None:
    cm, (codec, down) = r.comm, codecs(r)
    head = torch.empty(Reply.LEN, dtype=torch.float64)
    reply, model = _pull(cm, head, r.device)
    delay, timer, it = _delay(cm.rank), PhaseTimer(r.device), 0
    while not reply.stop:
        x, y = r.data.batch(it)
        cm.bytes_sent = 0
        timer.start()
        decode_model(down, model, r.sizes, r.params)
        timer.mark("decode")
        r.grads.zero_()
        with precision.autocast(
            r.spec.compute.precision, r.device
        ):  # int8: the model is fake-quantized
            loss = r.loss_fn(r.model(x), y)
        (loss * r.scaler.scale if r.scaler.enabled else loss).backward()
        nonfinite.unscale(r.scaler, r.grads)  # fp16 overflow: push a zero gradient
        value = float(loss.detach())  # travels in the push header
        if delay:
            time.sleep(delay)
        timer.mark("compute")
        skipped = not r.guard.check(it, r.grads, timer)  # a NaN or inf: fail, or push none
        wires = [] if skipped else codec.encode(r.grads, step=it, rank=cm.rank)
        payload = torch.cat(wires) if wires else torch.empty(0, dtype=torch.uint8)
        timer.mark("encode")
        sizes = tuple(w.numel() for w in wires) or (0,) * len(codec.groups)
        push = Push(cm.rank, reply.version, value, sizes, skipped)
        send_message(cm, push.to_tensor(), payload, SERVER)
        reply, model = _pull(cm, head, r.device)
        timer.mark("comm")
        r.rows.append(_row(r, it, timer, int(payload.numel()), value, reply, skipped))
        it += 1


def _pull(cm: Comm, head: torch.Tensor, device: torch.device) -> tuple[Reply, torch.Tensor]:
    cm.recv(head, SERVER, tag=HEADER)
    reply = Reply.from_tensor(head)
    model = torch.empty(reply.size, dtype=torch.uint8)
    if reply.size:
        cm.recv(model, SERVER, tag=PAYLOAD)
    return reply, model.to(device)


def _row(
    r: AsyncParts, it: int, timer: PhaseTimer, payload: int, loss: float, reply: Reply,
    skipped: bool,
) -> dict[str, Any]:  # fmt: skip
    return {
        "run_id": r.spec.run_id, "rank": r.comm.rank, "iteration": it,
        "warmup": it < r.spec.measurement.warmup, **{f"t_{k}": v for k, v in timer.totals.items()},
        "t_iteration": timer.elapsed(), "bytes_sent": r.comm.bytes_sent,
        "payload_bytes": payload, "grad_bytes": 4 * r.grads.numel(), "loss": loss,
        "staleness": reply.staleness, "server_version": reply.applied_as,
        "skipped": float(skipped),
    }  # fmt: skip
