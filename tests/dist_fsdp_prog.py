"""FSDP collective cases on K gloo ranks in one launch (under torchrun); rank r saves its records.

usage: python tests/dist_fsdp_prog.py OUT_DIR

* ``rs-none/<op>``: a block gradient that differs per rank through torch's reduce-scatter and
  through qbench's compressed one with the ``none`` codec (sum and mean).
* ``ag-none``: a parameter shard through torch's all-gather and the compressed one (``none``).
* ``rs-unbiased``: a fixed known gradient per rank (``known``) through the compressed
  reduce-scatter with a coarse QSGD ``STEPS`` times; the mean of the outputs, the bytes sent
  and the codec's wire size of one shard.
* ``ag-qsgd``: a shard all-gathered with QSGD 8-bit: what every rank gathered.
* ``ef-slots``: 1-bit SGD's error-feedback slots after one compressed reduce-scatter.
* ``model/<how>``: a three-block model trained ``TRAIN_STEPS`` steps under FSDP2 with torch's
  collectives, with ``qbench.fsdp.register(model, "none")`` and with QSGD 8-bit; the final
  parameters (whole, every rank) and the losses.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import qbench.fsdp
from qbench.comm.torchdist import TorchDistComm
from qbench.compress import from_spec
from qbench.fsdp import collectives as c

SHARD = 1_001  # odd: partial buckets and bytes
STEPS = 200
TRAIN_STEPS = 30
QSGD2 = {"name": "qsgd", "bits": 2, "bucket_size": 16}  # coarse: a biased sum would show


def known(rank: int, k: int) -> torch.Tensor:
    """Rank ``rank``'s block gradient (K shards of SHARD values), the same in every process."""
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(k * SHARD, generator=gen) * (1 + rank)


def rs_none(comm: TorchDistComm, group: Any) -> dict[str, Any]:
    k, out = comm.world_size, {}
    for name, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
        grad = known(comm.rank, k)
        want = torch.empty(SHARD)
        dist.reduce_scatter_single(want, grad.clone(), op=op, group=group)
        got = torch.empty(SHARD)
        rs = c.CompressedReduceScatter(c.CommLog(), comm, from_spec("none"), block=0)
        rs.log.begin(0)
        rs(got, grad.clone(), group, op)
        out[f"rs-none/{name}"] = {"torch": want, "qbench": got, "sent": rs.log.bytes_sent()}
    return out


def ag_none(comm: TorchDistComm, group: Any) -> dict[str, Any]:
    shard = known(comm.rank, 1)
    want = torch.empty(comm.world_size * SHARD)
    dist.all_gather_single(want, shard, group=group)
    got = torch.empty_like(want)
    ag = c.CompressedAllGather(c.CommLog(), comm, from_spec("none"), block=0)
    ag.log.begin(0)
    ag(got, shard, group)
    return {"ag-none": {"torch": want, "qbench": got}}


def rs_unbiased(comm: TorchDistComm, group: Any) -> dict[str, Any]:
    codec = from_spec(QSGD2, seed=3)
    rs = c.CompressedReduceScatter(c.CommLog(), comm, codec, block=0)
    total, sent = torch.zeros(SHARD, dtype=torch.float64), []
    for step in range(STEPS):
        rs.log.begin(step)
        out = torch.empty(SHARD)
        rs(out, known(comm.rank, comm.world_size), group, dist.ReduceOp.AVG)
        total += out.double()
        sent.append(rs.log.bytes_sent())
    return {"rs-unbiased": {"mean": total / STEPS, "sent": sent,
                            "wire": codec.wire_nbytes(SHARD)}}  # fmt: skip


def ag_qsgd(comm: TorchDistComm, group: Any) -> dict[str, Any]:
    ag = c.CompressedAllGather(c.CommLog(), comm, from_spec({"name": "qsgd", "bits": 8}), 0)
    ag.log.begin(0)
    got = torch.empty(comm.world_size * SHARD)
    ag(got, known(comm.rank, 1), group)
    return {"ag-qsgd": {"gathered": got, "sent": ag.log.bytes_sent()}}


def ef_slots(comm: TorchDistComm, group: Any) -> dict[str, Any]:
    codec = from_spec("onebit")
    rs = c.CompressedReduceScatter(c.CommLog(), comm, codec, block=5)
    rs.log.begin(0)
    rs(torch.empty(SHARD), known(comm.rank, comm.world_size), group, dist.ReduceOp.AVG)
    return {"ef-slots": sorted(codec.state)}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4))  # fmt: skip


def train(comm: TorchDistComm, how: str) -> dict[str, Any]:
    model = _model()
    for block in model:
        if isinstance(block, nn.Linear):
            fully_shard(block)
    fully_shard(model)
    log = None
    if how != "torch":
        log = qbench.fsdp.register(model, **({"name": "none"} if how == "none" else
                                             {"name": "qsgd", "bits": 8}), comm=comm)  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(7 + comm.rank)
    target = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    losses = []
    for step in range(TRAIN_STEPS):
        if log is not None:
            log.begin(step)
        x = torch.randn(32, 16, generator=gen)
        loss = ((model(x) - x @ target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    whole = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    return {f"model/{how}": {"params": whole, "losses": losses,
                             "sent": None if log is None else log.bytes_sent()}}  # fmt: skip


def main(out: Path) -> None:
    comm = TorchDistComm("gloo")
    group = dist.group.WORLD
    records: dict[str, Any] = {}
    for case in (rs_none, ag_none, rs_unbiased, ag_qsgd, ef_slots):
        records.update(case(comm, group))
    for how in ("torch", "none", "qsgd8"):
        records.update(train(comm, how))
    torch.save(records, out / f"rank{comm.rank}.pt")
    comm.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
