"""async-ps (seed 003: AsyLPG, Sparse-AsyLPG, accelerated AsyLPG): parameters, the staleness
rule, the message and gradient codecs, seed 003's bits-until-loss metric, the whole protocol
on in-process ranks (threads), and real gloo / MPI runs through ``qbench sweep``."""

from __future__ import annotations

import math
import os
import queue
import random
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from qbench import aggregate
from qbench.comm.base import Comm
from qbench.compress import from_spec
from qbench.errors import UserError
from qbench.run import async_ps
from qbench.run.async_ps import AsyncParts
from qbench.run.async_ps.metrics import bits_until_loss
from qbench.run.async_ps.protocol import (
    GradientCodec,
    Push,
    Reply,
    decode_model,
    encode_model,
    may_hand_out,
)
from qbench.run.loops.flat import async_parts
from qbench.run.loops.training import Training
from qbench.spec import scenario
from qbench.spec.matrix import expand
from tests import invoke

QSGD8 = {"name": "qsgd", "bits": 8}


# -- parameters and expansion ----------------------------------------------------------------
def test_defaults_and_valid_parameters() -> None:
    got = aggregate.check_params("async-ps", {})
    assert got == {"staleness": 4, "variant": "asylpg", "down": None, "ratio": 0.1}
    got = aggregate.check_params(
        "async-ps", {"staleness": 0, "variant": "sparse", "ratio": 1, "down": "fp16"}
    )
    assert got == {"staleness": 0, "variant": "sparse", "down": {"name": "fp16"}, "ratio": 1.0}


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"staleness": -1}, ["staleness", "-1", ">= 0"]),
        ({"staleness": 1.5}, ["staleness", "1.5"]),
        ({"staleness": True}, ["staleness", "True"]),
        ({"variant": "fast"}, ["variant", "fast", "asylpg", "sparse", "accelerated"]),
        ({"ratio": 0.5}, ["ratio", "sparse"]),
        ({"variant": "sparse", "ratio": 0}, ["ratio", "(0, 1]"]),
        ({"variant": "sparse", "ratio": 2.0}, ["ratio", "2.0"]),
        ({"down": {"name": "topk"}}, ["down", "topk", "qsgd"]),
        ({"down": {"name": "onebit"}}, ["down", "onebit"]),
        ({"down": {"bits": 8}}, ["down", "name"]),
        ({"down": {"name": "qsgd", "bits": 12}}, ["bits", "12"]),
        ({"down": {"name": "qsgd", "seed": 1}}, ["seed"]),
        ({"tau": 4}, ["unknown", "tau", "staleness"]),
    ],
)
def test_bad_parameters_are_one_line_errors(params: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(UserError) as e:
        aggregate.check_params("async-ps", params)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_expansion_excludes_one_rank_and_nccl_with_reasons() -> None:
    text = "name: a\nmodel: logreg\nscheme: {name: async-ps}\nworld_size: [1, 3]\n"
    text += "backend: [gloo, nccl]\n"
    m = expand(scenario.loads(text))
    assert [(r.placement.backend, r.placement.world_size) for r in m.runs] == [("gloo", 3)]
    reasons = " | ".join(e.reason for e in m.excluded)
    assert "world_size >= 2, got 1" in reasons and "nccl" in reasons


def test_scheme_label_names_the_variant() -> None:
    text = "name: a\nmodel: logreg\nworld_size: 3\n"
    text += "scheme: {name: async-ps, staleness: 2, variant: sparse, ratio: 0.2, "
    text += "down: {name: qsgd}}\n"
    assert "async-ps+downqsgd-4b-b512+ratio0.2+staleness2+variantsparse" in (
        expand(scenario.loads(text)).runs[0].run_id
    )


# -- the staleness rule ------------------------------------------------------------------------
def test_rule_examples() -> None:
    assert may_hand_out(7, [], 0)  # nothing in flight: always (tau 0 = serial SGD)
    assert not may_hand_out(7, [7], 0)
    assert may_hand_out(7, [7], 1)
    # oldest in flight saw version 5: it may already miss 2 updates, plus 2 others in flight
    assert may_hand_out(7, [5, 6], 4)
    assert not may_hand_out(7, [5, 6], 3)


@pytest.mark.parametrize("tau", [0, 1, 2, 5, 9])
@pytest.mark.parametrize("workers", [1, 3, 6])
def test_rule_bounds_staleness_under_any_arrival_order(tau: int, workers: int) -> None:
    """A server that hands out models by the rule and receives gradients in random order
    applies every update of the budget, each with staleness <= tau, and never deadlocks."""
    rnd = random.Random(tau * 100 + workers)
    version, budget, pulled, waiting = 0, 200, {}, list(range(workers))
    seen = []
    while version < budget:
        while waiting and version + len(pulled) < budget:
            if not may_hand_out(version, pulled.values(), tau):
                break
            pulled[waiting.pop(0)] = version
        assert pulled, "deadlock: nothing in flight, budget left"
        w = rnd.choice(list(pulled))  # any in-flight gradient may land next
        seen.append(version - pulled.pop(w))
        version += 1
        waiting.append(w)
    assert max(seen) <= tau
    if workers > 1 and tau >= 2 * (workers - 1):  # room for every worker: they overlap
        assert max(seen) >= workers - 1


# -- messages and gradient codec ---------------------------------------------------------------
def test_headers_round_trip() -> None:
    p = Push(worker=3, version=2**40, loss=0.125, sizes=(7, 0, 123456))
    assert Push.from_tensor(p.to_tensor()) == p
    assert len(p.to_tensor()) == Push.header_len(3)
    r = Reply(version=9, staleness=2.0, applied_as=10.0, stop=True, size=0)
    assert Reply.from_tensor(r.to_tensor()) == r
    first = Reply.from_tensor(Reply(version=0).to_tensor())
    assert math.isnan(first.staleness) and not first.stop


def _groups(
    specs: Sequence[dict[str, Any]], sizes: Sequence[int]
) -> list[tuple[slice, Any, tuple[int, ...]]]:
    out, pos = [], 0
    for spec, n in zip(specs, sizes, strict=True):
        out.append((slice(pos, pos + n), from_spec(spec), (n,)))
        pos += n
    return out


def test_codec_round_trips_per_group() -> None:
    groups = _groups([QSGD8, {"name": "none"}], [1000, 10])
    g = torch.randn(1010)
    wires = GradientCodec(groups, None).encode(g, step=0, rank=1)
    assert [w.numel() for w in wires] == [1000 + 2 * 4, 40]  # 8-bit codes + 2 scales; fp32
    out = torch.empty(1010)
    GradientCodec(groups, None).decode(torch.cat(wires), [w.numel() for w in wires], out)
    assert torch.equal(out[1000:], g[1000:])
    assert (out[:1000] - g[:1000]).abs().max() <= g[:1000].abs().max() / 127


def test_sparse_codec_keeps_top_values_and_feeds_back_the_rest() -> None:
    groups = _groups([{"name": "none"}, {"name": "none"}], [100, 7])
    worker, server = GradientCodec(groups, 0.1), GradientCodec(groups, 0.1)
    total_in, total_out = torch.zeros(107), torch.zeros(107)
    out = torch.empty(107)
    for step in range(30):
        g = torch.randn(107, generator=torch.Generator().manual_seed(step))
        wires = worker.encode(g, step=step, rank=1)
        assert [w.numel() for w in wires] == [10 * 8, 1 * 8]  # int32 index + fp32 value each
        server.decode(torch.cat(wires), [w.numel() for w in wires], out)
        assert int((out[:100] != 0).sum()) <= 10 and int((out[100:] != 0).sum()) <= 1
        total_in += g
        total_out += out
    residual = torch.cat([worker.topk.state["g0.0"], worker.topk.state["g1.0"]])  # type: ignore[union-attr]
    torch.testing.assert_close(total_out + residual, total_in, rtol=0, atol=1e-4)


def test_sparse_codec_keeps_the_top_of_every_tensor_of_a_group() -> None:
    # One group of two tensors, 1000 large values and 50 tiny ones: one top-k over the group
    # would send none of the tiny tensor; per tensor, each keeps ceil(0.02 n): 20 and 1.
    groups = [(slice(0, 1050), from_spec({"name": "none"}), (1000, 50))]
    g = torch.cat([torch.full((1000,), 1.0), torch.full((50,), 1e-3)])
    g[1000 + 7] = 2e-3  # the small tensor's top entry
    codec = GradientCodec(groups, 0.02)
    (wire,) = codec.encode(g, step=0, rank=1)
    assert wire.numel() == (20 + 1) * 8  # int32 index + fp32 value per kept entry
    out = torch.empty(1050)
    GradientCodec(groups, 0.02).decode(wire, [wire.numel()], out)
    assert int((out[:1000] != 0).sum()) == 20
    assert out[1000:].nonzero().flatten().tolist() == [7] and out[1007] == 2e-3


def test_sparse_then_quantized_payload_is_smaller() -> None:
    groups = _groups([QSGD8], [4096])
    g = torch.randn(4096)
    dense = sum(w.numel() for w in GradientCodec(groups, None).encode(g, step=0, rank=1))
    sparse = sum(w.numel() for w in GradientCodec(groups, 0.1).encode(g, step=0, rank=1))
    assert sparse == 410 * 4 + 410 + 4 and sparse < dense  # indices, 8-bit codes, one scale


# Sparse-AsyLPG, small next to large: one group of a tensor of values ~1 and one of ~1e-3. At
# ratio 0.1 each keeps its top ceil(0.1 n): the 100 values 1.90..2.00 and the 5 values
# 1.98e-3..2.00e-3 (the tensors' last entries).
SMALL_NEXT_TO_LARGE = (1000, 50)
# Error bound of one value of a tensor quantized alone, as a multiple of its max |x| s, from
# each quantizer's definition (module docstrings): QSGD 4-bit intervals, grid step 2 s / 15;
# fixed point 6-bit auto delta, step 2^e < 2 s / 31; adaptive, levels s / L with
# L = 2^(N-1) - 1 >= 31 (width N >= floor_bits 6).
PER_TENSOR = {
    "qsgd-tensor": ({"name": "qsgd", "bits": 4, "align": "tensor"}, 2 / 15),
    "fixedpoint": ({"name": "fixedpoint", "bits": 6}, 2 / 31),
    "adaptive": ({"name": "adaptive"}, 1 / 31),
}


def _small_next_to_large() -> torch.Tensor:
    return torch.cat([torch.linspace(1.0, 2.0, 1000), torch.linspace(1e-3, 2e-3, 50)])


def _sparse_round_trip(spec: dict[str, Any], g: torch.Tensor, step: int = 0) -> torch.Tensor:
    groups = [(slice(0, g.numel()), from_spec(spec), SMALL_NEXT_TO_LARGE)]
    (wire,) = GradientCodec(groups, 0.1).encode(g, step=step, rank=1)
    out = torch.empty(g.numel())
    GradientCodec(groups, 0.1).decode(wire, [wire.numel()], out)
    return out


@pytest.mark.parametrize("spec", list(PER_TENSOR), ids=list(PER_TENSOR))
def test_sparse_codec_quantizes_each_tensors_kept_values_with_their_own_scale(
    spec: str,
) -> None:
    """A per-tensor compressor gives each tensor's kept values their own scale, so the small
    tensor's are as exact as if quantized alone. One scale for the group's kept values (the
    old encoding) rounds values of 2e-3 on the grid of 2: off by about 0.13 each."""
    comp, per_s = PER_TENSOR[spec]
    g = _small_next_to_large()
    out = _sparse_round_trip(comp, g)
    assert out[:900].eq(0).all() and out[1000:1045].eq(0).all()  # dropped values
    assert (out[900:1000] - g[900:1000]).abs().max() <= per_s * 2.0
    assert (out[1045:] - g[1045:]).abs().max() <= per_s * 2e-3
    small = float((out[1045:] - g[1045:]).norm() / g[1045:].norm())
    assert small <= per_s  # relative error in norm, bounded as alone


def test_sparse_codec_keeps_one_vector_where_the_compressor_says_so() -> None:
    """QSGD with contiguous buckets (granularity bucket): the group's 105 kept values form one
    bucket of scale 2, whose levels -2 + j 4 / 15 nearest to 2e-3 are -2/15 and 2/15."""
    g = _small_next_to_large()
    out = _sparse_round_trip({"name": "qsgd", "bits": 4}, g)
    torch.testing.assert_close(out[1045:].abs(), torch.full((5,), 2 / 15), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("spec", "nbytes"),
    [
        # 105 int32 indices (420 bytes), then per tensor: 4-bit codes ceil(4 k / 8) and one
        # fp32 scale per started bucket of 512: (50 + 4) + (3 + 4)
        ({"name": "qsgd", "bits": 4, "align": "tensor"}, 420 + 54 + 7),
        # contiguous buckets: the 105 values as one, ceil(420 / 8) = 53 bytes and one scale
        ({"name": "qsgd", "bits": 4}, 420 + 53 + 4),
        # 6-bit codes ceil(6 k / 8) and an int16 exponent per tensor: (75 + 2) + (4 + 2)
        ({"name": "fixedpoint", "bits": 6}, 420 + 77 + 6),
        ({"name": "fixedpoint", "bits": 6, "scope": "global"}, 420 + 79 + 2),
    ],
    ids=["qsgd-tensor", "qsgd-contiguous", "fixedpoint-layer", "fixedpoint-global"],
)
def test_sparse_wire_counts_every_tensors_header(spec: dict[str, Any], nbytes: int) -> None:
    groups = [(slice(0, 1050), from_spec(spec), SMALL_NEXT_TO_LARGE)]
    (wire,) = GradientCodec(groups, 0.1).encode(_small_next_to_large(), step=0, rank=1)
    assert wire.numel() == nbytes


def test_sparse_per_tensor_quantization_is_unbiased() -> None:
    """Mean over 400 independent draws (step keys the draws; a fresh codec each time, so no
    residual changes what is kept) against the kept values. Stochastic rounding on a grid of
    step d has variance p (1 - p) d^2 <= d^2 / 4: a standard error <= d / (2 sqrt(400)) = d / 40
    per value, d = 2 s / 15 with each tensor's own s; allowed 4 of them."""
    g, draws = _small_next_to_large(), 400
    total = torch.zeros(1050, dtype=torch.float64)
    for step in range(draws):
        total += _sparse_round_trip(PER_TENSOR["qsgd-tensor"][0], g, step=step)
    mean = (total / draws).float()
    assert ((mean[900:1000] - g[900:1000]).abs() <= 4 * (2 * 2.0 / 15) / 40).all()
    assert ((mean[1045:] - g[1045:]).abs() <= 4 * (2 * 2e-3 / 15) / 40).all()


def test_model_sent_down_is_quantized_tensor_by_tensor() -> None:
    """The reply path (double quantization's model half): a per-tensor ``down`` gives the
    small tensor its own scale; the same bound as for the gradients."""
    down = from_spec(PER_TENSOR["qsgd-tensor"][0])
    model = _small_next_to_large()
    wire = encode_model(down, model, SMALL_NEXT_TO_LARGE, version=3, worker=1)
    assert wire.numel() == (500 + 2 * 4) + (25 + 4)  # 4-bit codes, a scale per 512 values
    out = torch.empty(1050)
    decode_model(down, wire, SMALL_NEXT_TO_LARGE, out)
    assert (out[1000:] - model[1000:]).abs().max() <= 2 / 15 * 2e-3
    assert (out[:1000] - model[:1000]).abs().max() <= 2 / 15 * 2.0


# -- point-to-point interface ------------------------------------------------------------------
class Threads(Comm):
    """Rank ``rank`` of ranks that are threads; point-to-point messages through queues."""

    backend = "threads"

    def __init__(self, rank: int, world_size: int, boxes: list[queue.Queue[Any]]) -> None:
        super().__init__()
        self.rank, self.world_size, self.boxes = rank, world_size, boxes
        self.early: list[tuple[int, int, torch.Tensor]] = []  # received, not yet matched

    def _send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        self.boxes[dst].put((self.rank, tag, tensor.clone()))

    def _recv(self, tensor: torch.Tensor, src: int | None, tag: int) -> int:
        while True:
            for i, (s, t, data) in enumerate(self.early):
                if t == tag and src in (None, s):
                    del self.early[i]
                    tensor.copy_(data)  # sizes must match, as with gloo and MPI
                    return s
            self.early.append(self.boxes[self.rank].get(timeout=60))

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        raise AssertionError("async-ps must not use collectives while training")

    def _alltoallv(self, send: torch.Tensor, send_counts: Any, recv_counts: Any) -> torch.Tensor:
        raise AssertionError("async-ps must not use collectives while training")

    def barrier(self) -> None:
        return None

    def close(self) -> None:
        return None


def test_send_counts_bytes_and_base_comm_has_no_point_to_point() -> None:
    boxes: list[queue.Queue[Any]] = [queue.Queue(), queue.Queue()]
    a, b = Threads(0, 2, boxes), Threads(1, 2, boxes)
    a.send(torch.arange(5, dtype=torch.float64), 1, tag=1)
    a.send(torch.ones(3, dtype=torch.uint8), 1, tag=2)
    assert a.bytes_sent == 5 * 8 + 3 and b.bytes_sent == 0
    got = torch.empty(3, dtype=torch.uint8)
    assert b.recv(got, None, tag=2) == 0 and got.tolist() == [1, 1, 1]  # tags keep them apart

    class NoP2P(Threads):
        _send = Comm._send
        _recv = Comm._recv

    with pytest.raises(NotImplementedError, match="point-to-point"):
        NoP2P(0, 1, boxes).send(torch.ones(1), 0)


# -- the protocol on threads -------------------------------------------------------------------
def _spec(scheme: str, comp: str = "{name: qsgd, bits: 8}", world: int = 4, extra: str = ""):
    text = f"name: t\nmodel: logreg\ndataset: digits\nworld_size: {world}\nscheme: {scheme}\n"
    text += f"compressor: {comp}\nlr: 0.05\nbatch_size: 32\nwarmup: 0\n{extra}"
    return expand(scenario.loads(text)).runs[0]


def _rank(spec: Any, cm: Comm) -> tuple[Training, AsyncParts]:
    """One rank as qbench.run.lifecycle sets it up: the shared training set-up and the parts of it
    the parameter server uses (they share the model, buffers and row lists)."""
    t = Training(spec, cm, shard=async_ps.shard(cm.rank, spec.placement.world_size))
    return t, async_parts(t)


def _on_threads(spec: Any, delay: str = "") -> list[tuple[Training, AsyncParts]]:
    k = spec.placement.world_size
    boxes: list[queue.Queue[Any]] = [queue.Queue() for _ in range(k)]
    runs = [_rank(spec, Threads(rank, k, boxes)) for rank in range(k)]
    errors: list[BaseException] = []

    def go(parts: AsyncParts) -> None:
        try:
            async_ps.run(parts)
        except BaseException as e:  # reported below, naming the rank
            errors.append(e)

    os.environ["QBENCH_ASYNC_DELAY"] = delay
    try:
        threads = [threading.Thread(target=go, args=(parts,)) for _, parts in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        os.environ.pop("QBENCH_ASYNC_DELAY")
    assert not errors, errors
    return runs


def _frames(runs: list[tuple[Training, AsyncParts]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    frame = pd.concat([t.frame() for t, _ in runs], ignore_index=True)
    return frame[frame["rank"] == 0], frame[frame["rank"] > 0]


@pytest.mark.parametrize(
    "scheme",
    [
        "{name: async-ps, staleness: 3, down: {name: qsgd, bits: 8}}",
        "{name: async-ps, staleness: 3, down: {name: qsgd, bits: 8}, variant: sparse, ratio: 0.3}",
        "{name: async-ps, staleness: 3, down: {name: qsgd, bits: 8}, variant: accelerated}",
    ],
    ids=["asylpg", "sparse", "accelerated"],
)
def test_threads_learn_within_the_staleness_bound(scheme: str) -> None:
    spec = _spec(scheme, extra="iterations: 30\nmomentum: 0.5\n")
    server, workers = _frames(_on_threads(spec))
    assert list(server["iteration"]) == list(range(90))  # 3 workers x 30 pushes on average
    assert list(server["server_version"]) == list(range(1, 91))
    assert server["staleness"].max() <= 3 and workers["staleness"].max() <= 3
    assert len(workers) == 90 and server["cum_bits"].is_monotonic_increasing
    assert server["loss"].tail(20).mean() < 0.7 * server["loss"].head(10).mean()
    # a worker's row reports the staleness the server gave its update
    merged = workers.merge(server, on="server_version", suffixes=("", "_server"))
    assert len(merged) == 90 and (merged["staleness"] == merged["staleness_server"]).all()


def test_sparse_run_counts_every_tensors_header_in_its_bytes() -> None:
    """Sparse-AsyLPG with QSGD 8-bit per tensor both ways, logreg's weight (7840) and bias (10)
    in one group (full_precision_below 0), ratio 0.3: kept ceil(0.3 n) = 2352 and 3.
    Push payload: 2355 int32 indices, then per tensor 8-bit codes and a scale per started
    bucket of 512: 9420 + (2352 + 5 * 4) + (3 + 4) = 11799 bytes (one vector: 11795), plus the
    float64 push header (its length is the protocol's, tested above). Reply: (7840 + 16 * 4)
    + (10 + 4) = 7918, plus the 5-value float64 header = 7958 (one vector: 7954)."""
    qsgd = "{name: qsgd, bits: 8, align: tensor}"
    scheme = f"{{name: async-ps, staleness: 3, variant: sparse, ratio: 0.3, down: {qsgd}}}"
    extra = "iterations: 3\nlayers: {full_precision_below: 0}\n"
    server, workers = _frames(_on_threads(_spec(scheme, comp=qsgd, world=2, extra=extra)))
    push = 11799 + 8 * Push.header_len(1)
    assert list(workers["payload_bytes"]) == [11799] * 3
    assert list(workers["bytes_sent"]) == [push] * 3
    assert list(server["payload_bytes"]) == [11799] * 3
    assert list(server["bytes_sent"]) == [7958] * 3  # the reply sent before each update
    assert server["cum_bits"].iloc[-1] == 8 * 3 * (push + 7958)  # all bits, up and down


def test_accuracy_mode_evaluates_the_server_model_each_epoch() -> None:
    spec = _spec("{name: async-ps, staleness: 4}", comp="none", world=3, extra="epochs: 2\n")
    runs = _on_threads(spec)
    ep = pd.DataFrame(runs[0][0].epoch_rows)
    steps = (1437 // 2) // 32  # each of 2 workers holds half of digits' 1437 training samples
    assert list(ep["epoch"]) == [1, 2] and list(ep["iteration"]) == [2 * steps, 4 * steps]
    assert ep["top1"].iloc[-1] > 0.8 and (ep["grad_norm"] > 0).all()
    assert ep["bytes_sent"].is_monotonic_increasing and ep["train_time_s"].is_monotonic_increasing


def test_a_slow_worker_does_not_stall_the_others() -> None:
    spec = _spec("{name: async-ps, staleness: 12}", extra="iterations: 20\n")
    server, workers = _frames(_on_threads(spec, delay="3:0.1"))
    pushes = workers.groupby("rank").size()
    assert pushes.sum() == 60 and pushes[3] * 2 < min(pushes[1], pushes[2]), pushes
    assert server["staleness"].max() <= 12


def test_refuses_settings_it_does_not_implement() -> None:
    """Refused by the planner (qbench.spec.rules), before any rank starts: the run-time check
    it replaced let a scenario start its ranks first."""
    text = "name: t\nmodel: logreg\ndataset: digits\nworld_size: 2\nscheme: [async-ps, "
    text += "allgather]\ncompressor: {name: qsgd, bits: 8}\ntelemetry: true\n"
    m = expand(scenario.loads(text))
    assert [r.method.scheme.name for r in m.runs] == ["allgather"]
    assert [e.reason for e in m.excluded] == [
        "async-ps records no per-layer telemetry; remove `telemetry` from the scenario for "
        "async-ps runs"
    ]


@pytest.mark.parametrize("extra", ["compute: bf16\n", "compute: int8\nweights: {bits: 8}\n"])
def test_low_precision_compute_and_weights_learn(extra: str) -> None:
    """Workers compute in the run's precision and the server rounds its model to N bits after
    every update: the loss still falls, and the model stays on the N-bit grid."""
    spec = _spec("{name: async-ps, staleness: 3}", extra="iterations: 30\n" + extra)
    runs = _on_threads(spec)
    server, _ = _frames(runs)
    assert len(server) == 90
    assert server["loss"].tail(20).mean() < 0.7 * server["loss"].head(10).mean()
    if spec.compute.weight_bits:
        params, sizes = runs[0][1].params, runs[0][1].sizes
        for t in params.split(sizes):  # per-tensor scale s = max|w| / (2^(N-1) - 1)
            step = t.abs().max() / (2 ** (spec.compute.weight_bits - 1) - 1)
            levels = t / step
            torch.testing.assert_close(levels, levels.round(), rtol=0, atol=1e-3)


# -- seed 003's metric -------------------------------------------------------------------------
def _rows(run_id: str, losses: list[float], bits_per_update: float) -> list[dict[str, Any]]:
    return [
        {"run_id": run_id, "rank": 0, "iteration": i, "loss": loss,
         "cum_bits": bits_per_update * (i + 1)}
        for i, loss in enumerate(losses)
    ]  # fmt: skip


def test_bits_until_loss() -> None:
    rows = _rows("a", [2.0, 1.0, 0.4, 0.9, 0.3], 100.0) + _rows("b", [2.0, 1.5], 10.0)
    rows.append({"run_id": "a", "rank": 1, "iteration": 0, "loss": 0.0, "cum_bits": math.nan})
    rows.append({"run_id": "c", "rank": 0, "iteration": 0, "loss": 0.0, "cum_bits": math.nan})
    frame = pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # order must not matter
    got = bits_until_loss(frame, 0.5).set_index("run_id")
    assert list(got.index) == ["a", "b"]  # worker rows and other schemes' runs ignored
    assert got.at["a", "update"] == 2 and got.at["a", "bits"] == 300.0
    assert not got.at["b", "reached"] and math.isnan(got.at["b", "bits"])
    smooth = bits_until_loss(frame, 0.7, window=2).set_index("run_id")
    assert smooth.at["a", "update"] == 3  # means 1.5, 0.7 (not below 0.7), 0.65
    assert bits_until_loss(frame, 0.61, window=2).set_index("run_id").at["a", "update"] == 4
    with pytest.raises(ValueError, match="window"):
        bits_until_loss(frame, 0.5, window=0)


def _loaded(imports: str, prefixes: tuple[str, ...]) -> list[str]:
    found = f"sorted(m for m in sys.modules if m.startswith({prefixes!r}))"
    code = f"import sys, {imports}; print(*{found})"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()


def test_the_package_stands_alone_and_its_metric_needs_no_torch() -> None:
    """The server and workers read a rank through AsyncParts, never through the training loops
    or the worker; reports read the metric, so it and the package load no torch."""
    loops = ("qbench.run.worker", "qbench.run.lifecycle", "qbench.run.loops.flat")
    assert _loaded("qbench.run.async_ps.server, qbench.run.async_ps.client", loops) == []
    assert _loaded("qbench.run.async_ps.metrics", ("torch",)) == []


# -- real ranks ----------------------------------------------------------------------------------
def _sweep(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> pd.DataFrame:
    sc = tmp_path / "s.yaml"
    sc.write_text(text)
    proc = invoke.run(
        [sys.executable, "-m", "qbench.cli", "sweep", str(sc), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.concat(
        [pd.read_parquet(p) for p in sorted((tmp_path / "out").glob("*/iterations.parquet"))]
    )


@pytest.mark.slow
def test_gloo_and_mpi_runs_learn_digits_within_the_bound(tmp_path: Path) -> None:
    text = (
        "name: a\nmodel: logreg\ndataset: digits\nworld_size: 4\nbackend: [gloo, mpi]\n"
        "compressor: {name: qsgd, bits: 8}\nepochs: 2\nlr: 0.05\nmomentum: 0.5\n"
        "batch_size: 32\ntimeout: 300\nscheme:\n"
        "  - {name: async-ps, staleness: 4, down: {name: qsgd, bits: 8}}\n"
        "  - {name: async-ps, staleness: 4, down: {name: qsgd, bits: 8}, variant: sparse}\n"
        "  - {name: async-ps, staleness: 4, down: {name: qsgd, bits: 8}, variant: accelerated}\n"
        "exclude: [{backend: mpi, scheme: [{name: async-ps, staleness: 4, down: "
        "{name: qsgd, bits: 8}, variant: sparse}]}]\n"
    )
    frame = _sweep(tmp_path, text)
    assert frame["run_id"].nunique() == 5
    assert frame["staleness"].max() <= 4
    for run_id, rows in frame[frame["rank"] == 0].groupby("run_id"):
        assert rows["loss"].tail(20).mean() < 0.6 * rows["loss"].head(10).mean(), run_id
    for ep in (pd.read_parquet(p) for p in (tmp_path / "out").glob("*/epochs.parquet")):
        assert list(ep["epoch"]) == [1, 2] and ep["top1"].iloc[-1] > 0.7, ep


@pytest.mark.slow
def test_slow_gloo_worker_does_not_stall_the_others(tmp_path: Path) -> None:
    text = (
        "name: a\nmodel: logreg\ndataset: digits\nworld_size: 4\nbackend: gloo\n"
        "scheme: {name: async-ps, staleness: 12}\ncompressor: none\niterations: 20\n"
        "warmup: 0\nlr: 0.05\ntimeout: 300\n"
    )
    frame = _sweep(tmp_path, text, env={"QBENCH_ASYNC_DELAY": "3:0.2"})
    pushes = frame[frame["rank"] > 0].groupby("rank").size()
    assert pushes.sum() == 60 and pushes[3] * 2 < min(pushes[1], pushes[2]), pushes
    assert frame["staleness"].max() <= 12
