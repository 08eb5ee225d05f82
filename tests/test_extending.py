"""docs/architecture.md's "to add a compressor / scheme / model": a toy of each, added through
exactly the registration points the doc names, runs through the planner, the codecs, the
aggregators and the zoo with no other change to qbench."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from qbench import aggregate, catalog, compress, models
from qbench.aggregate.base import Aggregator
from qbench.catalog import models as zoo
from qbench.catalog.compressors import CompressorEntry
from qbench.catalog.models import ModelEntry
from qbench.catalog.params import Param
from qbench.catalog.schemes import SchemeEntry
from qbench.compress.base import Compressor, Key, Payload
from qbench.errors import UserError
from qbench.spec import matrix, scenario
from qbench.timing import PhaseTimer
from tests.aggregate.test_gossip import LocalComm, on_threads

# 1. A compressor: signs only, scaled by the mean |x| (a deterministic 1-bit toy).
TOY = CompressorEntry(
    "toysign", "signs scaled by the mean |x|", "", codec="tests.test_extending:ToySign",
    params=(Param("scale", "mean", "what scales the signs", str, choices=("mean", "max")),),
    label=lambda p: f"toysign-{p['scale']}",
    unlabel=lambda text: {"scale": text[8:]} if text in ("toysign-mean", "toysign-max") else None,
    nominal_bits=lambda p: 1.0,
    wire=lambda p, n: [("signs", "uint8", (n + 7) // 8), ("scale", "float32", 1)],
)  # fmt: skip


class ToySign(Compressor):
    name: ClassVar[str] = "toysign"
    scale: str

    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        s = grad.abs().mean() if self.scale == "mean" else grad.abs().max()
        bits = (grad >= 0).to(torch.uint8)
        pad = -grad.numel() % 8
        packed = torch.cat([bits, bits.new_zeros(pad)]).reshape(-1, 8)
        signs = (packed << torch.arange(8, dtype=torch.uint8)).sum(1).to(torch.uint8)
        return Payload(grad.numel(), {"signs": signs, "scale": s.reshape(1).float()})

    def _decode(self, payload: Payload) -> torch.Tensor:
        b = payload.buffers["signs"]
        bits = (b[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1
        signs = bits.reshape(-1)[: payload.numel].float() * 2 - 1
        return signs * payload.buffers["scale"]


# 2. A scheme: the mean by one fp32 allreduce of the decoded payloads (a toy of allreduce).
TOY_SCHEME = SchemeEntry(
    "toy-mean",
    "decode locally, then one fp32 allreduce of the decoded values",
    "",
    "tests.test_extending:ToyMean",
)


class ToyMean(Aggregator):
    name = "toy-mean"

    def aggregate(self, grad: torch.Tensor, step: int, timer: PhaseTimer) -> torch.Tensor:
        c = self.compressor
        rank, pieces = self.comm.rank, self.pieces()  # per-tensor compressors: each tensor
        out = c.decode(c.encode(grad, step=step, rank=rank, offset=self.offset, pieces=pieces))
        timer.mark("encode")
        self.comm.allreduce_(out)
        timer.mark("comm")
        return out.div_(self.comm.world_size)


# 3. A model.
TOY_MODEL = ModelEntry("toynet", (6,), 3, "Linear 6->3", "")


@pytest.fixture
def registered() -> Iterator[None]:
    """The registration points docs/architecture.md names, undone afterwards."""
    catalog.register_compressor(TOY)
    compress.register(ToySign)
    catalog.register_scheme(TOY_SCHEME)
    aggregate.register(ToyMean)
    zoo.register(TOY_MODEL)
    models.register("toynet", lambda p: nn.Linear(6, 3))
    yield
    for table, key in ((catalog.COMPRESSORS, "toysign"), (compress.COMPRESSORS, "toysign"),
                       (compress._ALL, "toysign"), (catalog.SCHEMES, "toy-mean"),
                       (aggregate.SCHEMES, "toy-mean"), (zoo.MODELS, "toynet"),
                       (models._BUILDERS, "toynet")):  # fmt: skip
        table.pop(key, None)  # type: ignore[attr-defined]


def test_a_toy_of_each_runs_through_planner_codec_scheme_and_zoo(registered: None) -> None:
    sc = scenario.loads(
        "name: toy\nmodel: [toynet]\nworld_size: 2\n"
        "scheme: [toy-mean, reduce-broadcast, allreduce]\n"
        "compressor: [{name: toysign, scale: max}]\n"
    )
    m = matrix.expand(sc)
    assert sorted(r.method.scheme_label for r in m.runs) == ["reduce-broadcast", "toy-mean"]
    assert [r.compressor_label for r in m.runs] == ["toysign-max"] * 2
    assert "cannot sum packed toysign" in m.excluded[0].reason  # the catalog's rules apply
    c = compress.from_spec({"name": "toysign", "scale": "max"})
    x = torch.tensor([0.5, -2.0, 1.0, -0.25, 3.0, 0.0, -1.0, 2.0, -3.0])
    payload = c.encode(x)
    assert payload.nbytes == catalog.compressor("toysign:scale=max").wire_bytes(9) == 2 + 4
    assert torch.equal(c.decode(payload), torch.where(x >= 0, 3.0, -3.0))
    assert catalog.from_label("toysign-max").params == {"scale": "max"}

    def rank(cm: LocalComm) -> Any:
        agg = aggregate.build("toy-mean", cm, compress.from_spec("toysign"), 9)
        g = x * (cm.rank + 1)  # rank 1 sends twice rank 0's gradient
        return agg.aggregate(g, 0, PhaseTimer(torch.device("cpu")))

    mean_abs = x.abs().mean()
    got = on_threads(2, rank)
    expected = torch.where(x >= 0, 1.0, -1.0) * mean_abs * (1 + 2) / 2
    for out in got:
        torch.testing.assert_close(out, expected)
    assert isinstance(models.build("toynet"), nn.Linear)
    assert models.parameter_count("toynet") == 6 * 3 + 3


def test_names_already_taken_are_refused(registered: None) -> None:
    with pytest.raises(UserError, match=r"compressor .toysign. is already registered"):
        catalog.register_compressor(TOY)
