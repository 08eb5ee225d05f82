"""A plain PyTorch DDP or FSDP2 training loop with no qbench instrumentation: the reference
that ``scheme: ddp`` and ``scheme: fsdp`` must match (benchmarks/ddp_baseline.py runs both,
interleaved).

usage (one process per rank, env:// variables set by torchrun or qbench's shaped launcher):
    python benchmarks/plain_loop.py CONFIG_JSON
CONFIG_JSON: {"scheme", "model", "batch_size", "warmup", "iterations", "out"}. Rank 0 writes to
``out`` the per-iteration times, each the slowest rank's (as qbench counts an iteration).

It uses qbench only to build the same model and synthetic batch (``qbench.models``, ``data``); the
loop is what the PyTorch DDP and FSDP2 tutorials write: wrap (DDP; or ``fully_shard`` each
transformer block, then the root), then zero_grad, forward, loss, backward, step.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from qbench import data, models


def wrap(model: nn.Module, scheme: str) -> nn.Module:
    if scheme == "ddp":
        return DistributedDataParallel(model)
    for block in getattr(model, "blocks", []):  # the FSDP2 tutorial's transformer blocks
        fully_shard(block)
    fully_shard(model)
    return model


def main(config_path: str) -> None:
    cfg = json.loads(Path(config_path).read_text())
    torch.set_num_threads(1)  # one thread per CPU rank, as qbench's workers
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = wrap(models.build(cfg["model"], {}), cfg.get("scheme", "ddp"))
    info = models.info(cfg["model"], {})
    batches = data.make(
        "synthetic", info, cfg["batch_size"], seed=0, rank=dist.get_rank(),
        device=torch.device("cpu"),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for it in range(cfg["warmup"] + cfg["iterations"]):
        x, y = batches.batch(it)  # the batches a qbench run draws, drawn outside the clock
        start = time.perf_counter()
        opt.zero_grad()
        out = model(x)
        if out.dim() > 2:  # a language model: every position's logits against its target
            out, y = out.flatten(0, 1), y.flatten()
        loss_fn(out, y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        Path(cfg["out"]).write_text(json.dumps(slowest[cfg["warmup"] :].tolist()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
