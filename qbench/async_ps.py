"""Asynchronous parameter server with double quantization (seed 003, Yu, Wu and Huang):
AsyLPG, Sparse-AsyLPG and accelerated AsyLPG. Scheme ``async-ps`` (parameters in
``qbench.aggregate.async_ps``).

Rank 0 is a dedicated server holding the fp32 master model; ranks 1..K-1 are workers over K-1
partitions of the training set. There is no barrier: each worker repeatedly pulls the model
(quantized by ``down``: the model half of double quantization), computes a gradient on its next
batch, encodes it with the run's compressor (the gradient half) and pushes it. The server
applies each gradient when it arrives, one version per update, and holds a worker's next model
back while handing it out could let some update exceed the staleness bound tau
(``async_protocol.may_hand_out``). Variants:

* ``asylpg``: the server steps x <- x - lr (g + wd x) (plain SGD, as AsyLPG; no momentum);
* ``sparse``: the same, with each gradient top-k sparsified then quantized (``ratio``);
* ``accelerated``: Nesterov momentum with beta = the scenario's ``momentum``: workers get the
  look-ahead point y = x + beta v, and the server steps v <- beta v - lr (g + wd x), x <- x + v.

Seed 003 builds the three on SVRG (a snapshot and its full gradient per epoch); qbench's
workers send plain stochastic gradients, as every other scheme here does.

Rows: a worker writes one per push; the server one per update it applied, with the update's
staleness, the version it produced, the pushing worker's batch loss and ``cum_bits``, all bits
through the server so far (up and down, headers included): seed 003's "bits transmitted until
the training loss first falls below a threshold" (``qbench.async_metrics``).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import torch

from qbench import precision
from qbench.async_protocol import HEADER, PAYLOAD, SERVER, Push, Reply, codecs, send_message
from qbench.async_server import serve
from qbench.comm import Comm
from qbench.errors import UserError
from qbench.timing import PhaseTimer

if TYPE_CHECKING:
    from qbench.worker import Run

__all__ = ["run", "serve", "shard", "work"]


def shard(rank: int, world_size: int) -> tuple[int, int]:
    """The (index, count) of the training partition a rank owns: the workers split the training
    set; the server holds all of it, and the test split, to evaluate its model."""
    return (0, 1) if rank == SERVER else (rank - 1, world_size - 1)


def run(r: Run) -> None:
    if r.spec.telemetry:
        raise UserError(
            "async-ps records no per-layer telemetry; remove `telemetry` from the scenario "
            "for async-ps runs"
        )
    if r.comm.rank == SERVER:
        serve(r)
    else:
        work(r)


def _delay(rank: int) -> float:
    """QBENCH_ASYNC_DELAY=RANK:SECONDS makes that worker sleep this long per gradient (a slow
    worker), to test that it does not stall the others. Testing only."""
    got = os.environ.get("QBENCH_ASYNC_DELAY", "")
    who, _, seconds = got.partition(":")
    return float(seconds) if who and int(who) == rank else 0.0


# -- worker ---------------------------------------------------------------------------------
def work(r: Run) -> None:
    cm, _, codec, down = r.comm, *codecs(r)
    head = torch.empty(Reply.LEN, dtype=torch.float64)
    reply, model = _pull(cm, head, r.device)
    delay, timer, it = _delay(cm.rank), PhaseTimer(r.device), 0
    while not reply.stop:
        x, y = r.data.batch(it)
        cm.bytes_sent = 0
        timer.start()
        r.params.copy_(down.decode(down.from_wire(model, r.params.numel(), r.sizes)))
        timer.mark("decode")
        r.flat.zero_()
        with precision.autocast(r.spec.compute, r.device):  # int8: the model is fake-quantized
            loss = r.loss_fn(r.model(x), y)
        (loss * r.scaler.scale if r.scaler.enabled else loss).backward()
        if not r.scaler.unscale_(r.flat):
            r.flat.zero_()  # fp16 overflow: push a zero gradient; the loss scale halves
        value = float(loss.detach())  # travels in the push header
        if delay:
            time.sleep(delay)
        timer.mark("compute")
        wires = codec.encode(r.flat, step=it, rank=cm.rank)
        payload = torch.cat(wires) if wires else torch.empty(0, dtype=torch.uint8)
        timer.mark("encode")
        push = Push(cm.rank, reply.version, value, tuple(w.numel() for w in wires))
        send_message(cm, push.to_tensor(), payload, SERVER)
        reply, model = _pull(cm, head, r.device)
        timer.mark("comm")
        r.rows.append(_row(r, it, timer, int(payload.numel()), value, reply))
        it += 1


def _pull(cm: Comm, head: torch.Tensor, device: torch.device) -> tuple[Reply, torch.Tensor]:
    cm.recv(head, SERVER, tag=HEADER)
    reply = Reply.from_tensor(head)
    model = torch.empty(reply.size, dtype=torch.uint8)
    if reply.size:
        cm.recv(model, SERVER, tag=PAYLOAD)
    return reply, model.to(device)


def _row(
    r: Run, it: int, timer: PhaseTimer, payload: int, loss: float, reply: Reply
) -> dict[str, Any]:
    return {
        "run_id": r.spec.run_id, "rank": r.comm.rank, "iteration": it,
        "warmup": it < r.spec.warmup, **{f"t_{k}": v for k, v in timer.totals.items()},
        "t_iteration": timer.elapsed(), "bytes_sent": r.comm.bytes_sent,
        "payload_bytes": payload, "grad_bytes": 4 * r.flat.numel(), "loss": loss,
        "staleness": reply.staleness, "server_version": reply.applied_as,
    }  # fmt: skip
