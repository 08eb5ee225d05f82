"""DDP hook cases on K gloo ranks in one launch (under torchrun); rank r saves its records.

usage: python tests/dist_ddp_prog.py OUT_DIR [gloo|nccl]
(nccl: one GPU per rank, tensors on the rank's GPU; the records are saved on the CPU)

* ``mean``: a two-layer model whose gradients differ per rank, under DDP with torch's allreduce
  hook (scheme ddp, compressor none), several buckets; records DDP's gradient and the rank's own
  local gradient (the same model and batch without DDP), so the test forms the exact mean.
* ``unbiased/<id>``: one parameter vector whose gradient is a fixed known vector per rank
  (loss = <param, g_r>), so each DDP bucket is exactly g_r; ``STEPS`` steps through a qbench
  hook record the aggregate per step, and the same vector through the flat scheme (one call)
  records the flat scheme's bytes.
* ``train/<id>``: a small least-squares problem trained ``TRAIN_STEPS`` steps through each hook
  and through the flat scheme with the same compressor; records both final losses.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import qbench.ddp
from qbench import aggregate
from qbench.comm.torchdist import TorchDistComm
from qbench.compress import from_spec
from qbench.timing import PhaseTimer

NUMEL = 3_001  # odd: partial buckets and bytes
STEPS = 60
TRAIN_STEPS = 300
QSGD2 = {"name": "qsgd", "bits": 2, "bucket_size": 16}  # coarse: a biased sum would show
QSGD4 = {"name": "qsgd", "bits": 4, "bucket_size": 512}
QSGD8 = {"name": "qsgd", "bits": 8, "bucket_size": 256}
UNBIASED = {
    "rb-qsgd2": ("reduce-broadcast", QSGD2),
    "ag-qsgd2": ("allgather", QSGD2),
    "int-qsgd2": ("integer-allreduce", QSGD2),
    "rb-fixedpoint": ("reduce-broadcast", {"name": "fixedpoint", "bits": 6, "delta": 0.25}),
}
TRAIN = {
    "torch-none": (None, {"name": "none"}),
    "torch-fp16": (None, {"name": "fp16"}),
    "torch-powersgd": (None, {"name": "powersgd", "rank": 2}),
    "rb-qsgd4": ("reduce-broadcast", QSGD4),
    "ag-qsgd4": ("allgather", QSGD4),
    "int-qsgd8": ("integer-allreduce", QSGD8),
    "rb-onebit": ("reduce-broadcast", {"name": "onebit", "bucket_size": 64}),
    "rb-topk": ("reduce-broadcast", {"name": "topk", "ratio": 0.1}),
}


DEVICE = torch.device("cpu")  # the rank's GPU under nccl (main)


def known_gradient(rank: int) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(50 + rank))


def _hook(scheme: str | None, comp: dict[str, Any], comm: TorchDistComm) -> tuple[Any, Any]:
    params = {k: v for k, v in comp.items() if k != "name"}
    if scheme is None:
        return qbench.ddp.comm_hook(comp["name"], comm=comm, **params)
    return qbench.ddp.comm_hook(comp["name"], exchange=scheme, comm=comm, **params)


def mean_case(comm: TorchDistComm) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 3000), nn.Tanh(), nn.Linear(3000, 200))  # 2.9 MB
    local = nn.Sequential(nn.Linear(40, 3000), nn.Tanh(), nn.Linear(3000, 200))
    local.load_state_dict(model.state_dict())
    model, local = model.to(DEVICE), local.to(DEVICE)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.5)  # several buckets
    state, hook = _hook(None, {"name": "none"}, comm)
    ddp.register_comm_hook(state, hook)
    x = torch.randn(16, 40, generator=torch.Generator().manual_seed(comm.rank)).to(DEVICE)
    # DDP's first bucket holds up to 1 MB, the others bucket_cap_mb; it rebuilds its buckets
    # in gradient-ready order after the first iteration: measure the second.
    for _ in range(2):
        model.zero_grad()
        state.reset()
        ddp(x).pow(2).sum().backward()
    local(x).pow(2).sum().backward()
    return {
        "ddp": torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu(),
        "local": torch.cat([p.grad.reshape(-1) for p in local.parameters()]).cpu(),
        "buckets": len(state.timeline.handed),
    }


class _Known(nn.Module):
    """One parameter vector; loss <w, g>, so its gradient is exactly g."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(NUMEL))

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return (self.w * g).sum()


def unbiased_case(comm: TorchDistComm, scheme: str, comp: dict[str, Any]) -> dict[str, Any]:
    holder = _Known().to(DEVICE)
    param = holder.w
    ddp = DistributedDataParallel(holder)
    state, hook = _hook(scheme, comp, comm)
    ddp.register_comm_hook(state, hook)
    g = known_gradient(comm.rank).to(DEVICE)
    out, payloads = [], []
    for _ in range(STEPS):
        param.grad = None
        state.reset()
        ddp(g).backward()
        out.append(param.grad.clone().cpu())
        payloads.append(state.payload_bytes)
    state.close()
    flat = aggregate.build(scheme, comm, from_spec(comp), NUMEL)
    comm.bytes_sent = 0
    flat.aggregate(g.clone(), 0, PhaseTimer(DEVICE))
    return {
        "results": torch.stack(out),
        "payload_bytes": payloads,
        "flat_payload_bytes": flat.payload_bytes,
        "flat_bytes_sent": comm.bytes_sent,
    }


def train_case(comm: TorchDistComm, scheme: str | None, comp: dict[str, Any]) -> dict[str, Any]:
    """Least squares y = X w* on rank-specific data; final mean loss through the hook and flat."""
    gen = torch.Generator().manual_seed(10 + comm.rank)
    x = torch.randn(256, 32, generator=gen).to(DEVICE)
    w_true = torch.randn(32, 8, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    y = x @ w_true
    losses = {}
    for mode in ("hook", "flat"):
        torch.manual_seed(1)
        model = nn.Linear(32, 8, bias=False).to(DEVICE)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        if mode == "hook":
            ddp: nn.Module = DistributedDataParallel(model)
            state, hook = _hook(scheme, comp, comm)
            ddp.register_comm_hook(state, hook)  # type: ignore[operator]
        else:
            ddp = model
            # torch's hooks against flat allreduce; powersgd has no flat form: against fp32
            flat_scheme = scheme or "allreduce"
            flat_comp = comp if comp["name"] != "powersgd" else {"name": "none"}
            agg = aggregate.build(flat_scheme, comm, from_spec(flat_comp), 32 * 8)
        for step in range(TRAIN_STEPS):
            opt.zero_grad()
            loss = (ddp(x) - y).pow(2).mean()
            loss.backward()
            if mode == "flat":
                grad = model.weight.grad.reshape(-1)
                mean = agg.aggregate(grad, step, PhaseTimer(DEVICE))
                grad.copy_(mean)
            opt.step()
        with torch.no_grad():
            final = (model(x) - y).pow(2).mean().reshape(1)
        dist.all_reduce(final)
        losses[mode] = float(final) / comm.world_size
        if mode == "hook" and hasattr(state, "close"):
            state.close()
    return losses


def main() -> None:
    global DEVICE
    out = Path(sys.argv[1])
    backend = sys.argv[2] if len(sys.argv) > 2 else "gloo"
    torch.set_num_threads(1)
    if backend == "nccl":
        DEVICE = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(backend)
    comm = TorchDistComm.attach()
    record: dict[str, Any] = {"mean": mean_case(comm)}
    for id_, (scheme, comp) in UNBIASED.items():
        record[f"unbiased/{id_}"] = unbiased_case(comm, scheme, comp)
    for id_, (train_scheme, comp) in TRAIN.items():
        record[f"train/{id_}"] = train_case(comm, train_scheme, comp)
    torch.save(record, out / f"rank-{comm.rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
