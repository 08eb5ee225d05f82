"""Per-tensor compressors: every tensor of a group encoded on its own, in every scheme.

The definition (qbench.compress.base, docs/precision-and-layers.md): with ``pieces`` a
per-tensor compressor's payload is the payloads of the pieces, each encoded alone with its own
header, one after the other; draws stay keyed by global element index. References here are
separate encodes of each tensor, counts written out by hand, and, for the schemes, the
tensor boundaries: no encode may straddle one, and the messages may not multiply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from qbench import aggregate, catalog
from qbench.aggregate.base import cut, split_ranges
from qbench.compress import Compressor, from_spec
from qbench.ddp.scheme_hook import segments
from qbench.run.async_ps.protocol import GradientCodec
from qbench.spec.layers import LayerPolicy, plan
from qbench.timing import PhaseTimer
from tests.threadcomm import ThreadComm, run_ranks

SIZES = (10, 3000, 7, 1200)  # a bias and a weight, twice
PER_TENSOR = {
    "topk": {"name": "topk", "ratio": 0.01},
    "adaptive": {"name": "adaptive"},
    "fixedpoint": {"name": "fixedpoint", "bits": 6},
    "qsgd-tensor": {"name": "qsgd", "bits": 4, "bucket_size": 64, "align": "tensor"},
}
PER_CALL = {
    "topk-global": {"name": "topk", "ratio": 0.01, "scope": "global"},
    "adaptive-global": {"name": "adaptive", "scope": "global"},
    "fixedpoint-global": {"name": "fixedpoint", "bits": 6, "scope": "global"},
    "fixedpoint-delta": {"name": "fixedpoint", "bits": 6, "delta": 0.01},
    "qsgd": {"name": "qsgd", "bits": 4, "bucket_size": 64},
    "onebit": {"name": "onebit", "bucket_size": 64},
    "fp16": {"name": "fp16"},
}


def _x(n: int, seed: int = 0) -> torch.Tensor:
    # Layers of very different scales: what one shared scale or budget gets wrong.
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    return x * torch.linspace(0.01, 3.0, n) ** 2


# -- the codec --------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", list(PER_TENSOR.values()), ids=list(PER_TENSOR))
def test_a_piece_list_encodes_as_its_pieces_do_one_by_one(spec: dict[str, Any]) -> None:
    x, n = _x(sum(SIZES)), sum(SIZES)
    c, ref = from_spec(spec, seed=3), from_spec(spec, seed=3)
    assert c.granularity == "tensor"
    for step in range(2):  # the second step uses the error-feedback slots name/i
        payload = c.encode(x, step=step, rank=1, offset=100, name="g", pieces=SIZES)
        wires, decoded, pos = [], [], 0
        for i, m in enumerate(SIZES):
            one = ref.encode(x[pos : pos + m], step=step, rank=1, offset=100 + pos, name=f"g/{i}")
            wires.append(one.to_wire())
            decoded.append(ref.decode(one))
            pos += m
        wire = payload.to_wire()
        assert torch.equal(wire, torch.cat(wires))
        assert payload.nbytes == wire.numel() and len(payload.parts) == len(SIZES)
        back = c.from_wire(wire.clone(), n, SIZES)
        assert torch.equal(c.decode(back), torch.cat(decoded))
        acc = torch.ones(n)  # decode with out= adds, piece by piece
        assert torch.equal(c.decode(back, out=acc), torch.cat(decoded) + 1)
        if c.fixed_size:
            assert payload.nbytes == catalog.compressor(spec).wire_bytes(n, SIZES)
            assert payload.nbytes == c.wire_nbytes(n, SIZES)


@pytest.mark.parametrize("spec", list(PER_CALL.values()), ids=list(PER_CALL))
def test_other_granularities_ignore_pieces(spec: dict[str, Any]) -> None:
    x = _x(sum(SIZES))
    a, b = from_spec(spec, seed=1), from_spec(spec, seed=1)
    assert a.granularity != "tensor"
    with_pieces = a.encode(x, step=4, name="s", pieces=SIZES).to_wire()
    assert torch.equal(with_pieces, b.encode(x, step=4, name="s").to_wire())


def test_wire_bytes_with_pieces_written_out_by_hand() -> None:
    def wire(spec: str, n: int, pieces: list[int]) -> int | None:
        return catalog.compressor(spec).wire_bytes(n, pieces)

    # top-k 1% of [50, 150]: ceil(0.5) + ceil(1.5) = 1 + 2 entries of 8 bytes; one call: 2
    assert wire("topk", 200, [50, 150]) == 3 * 8
    assert wire("topk:scope=global", 200, [50, 150]) == 2 * 8
    # qsgd 4 bits, buckets of 64, over [70, 70]: 35 + 35 bytes of codes; 2 + 2 scales with the
    # buckets restarting at each tensor, ceil(140 / 64) = 3 contiguous
    assert wire("qsgd:bucket_size=64,align=tensor", 140, [70, 70]) == 70 + 4 * 4
    assert wire("qsgd:bucket_size=64", 140, [70, 70]) == 70 + 3 * 4
    # packing restarts per tensor: 3 bits x 3 values = 2 bytes each, 9 values together = 4
    assert wire("qsgd:bits=3,bucket_size=64,align=tensor", 6, [3, 3]) == 2 + 2 + 2 * 4
    # fixed point, auto delta: one int16 exponent per tensor
    assert wire("fixedpoint", 30, [10, 20]) == 30 + 2 * 2
    assert wire("fixedpoint:scope=global", 30, [10, 20]) == 30 + 2
    assert wire("adaptive", 30, [10, 20]) is None  # depends on the data
    with pytest.raises(ValueError, match="do not add up to 31"):
        wire("topk", 31, [10, 20])


def test_cut_and_split_at_tensor_boundaries() -> None:
    assert cut([300, 700], 250, 500) == [50, 200]
    assert cut([300, 700], 0, 1000) == [300, 700]
    assert cut([300, 0, 700], 300, 301) == [1]
    assert cut([300, 700], 400, 400) == []
    # buckets of 64 restarting at 300: range starts at 0, 64, ..., 256, 300, 364, ...;
    # the last one at or before 1000 i / 4 = 250, 500, 750 is 192, 492, 748
    assert split_ranges(1000, 4, 64, [300, 700]) == [(0, 192), (192, 492), (492, 748), (748, 1000)]
    assert split_ranges(1000, 4, 64) == [(0, 256), (256, 512), (512, 768), (768, 1000)]


def test_the_layer_plan_and_ddp_segments_keep_every_tensors_size() -> None:
    params = [("a.weight", 300), ("a.bias", 3), ("b.weight", 500), ("b.bias", 5)]
    groups = plan(params, {"name": "topk"}, LayerPolicy(full_precision_below=0))
    assert [(g.numel, g.sizes) for g in groups] == [(808, (300, 3, 500, 5))]
    q = {"name": "topk"}
    tensors = [torch.zeros(5), torch.zeros(2), torch.zeros(7), torch.zeros(3)]
    segs = segments(tensors, lambda p: q)
    assert [(s.ranges, s.sizes) for s in segs] == [(((0, 17),), (5, 2, 7, 3))]  # merged ranges


def test_the_ddp_hook_gives_each_segments_aggregator_its_tensors() -> None:
    from qbench.ddp.scheme_hook import SchemeHookState
    from tests.threadcomm import _Shared

    q = {"name": "topk"}
    state = SchemeHookState(
        scheme="reduce-broadcast", comm=ThreadComm(_Shared(1), 0, 1), seed=0, spec_for=lambda p: q
    )
    seg = segments([torch.zeros(5), torch.zeros(2), torch.zeros(7)], lambda p: q)[0]
    assert state._aggregator(seg).tensors == (5, 2, 7)


# -- the schemes ----------------------------------------------------------------------------------
TENSORS = (50, 700, 13, 400)
OFFSET = 1000


def _spied(spec: dict[str, Any], calls: list[tuple[int, int]]) -> Compressor:
    """The codec, recording (global offset, length) of every single-piece encode."""
    c = from_spec(spec, seed=2)
    inner = c._encode

    def spy(grad: torch.Tensor, key: Any, offset: int, name: str) -> Any:
        calls.append((offset, grad.numel()))
        return inner(grad, key, offset, name)

    c._encode = spy  # type: ignore[method-assign]
    return c


def _inside_one_tensor(offset: int, n: int) -> bool:
    pos = OFFSET
    for m in TENSORS:
        if pos <= offset and offset + n <= pos + m:
            return True
        pos += m
    return False


class _Counting(ThreadComm):
    messages = 0

    def _alltoallv(self, send: Any, send_counts: Any, recv_counts: Any) -> torch.Tensor:
        type(self).messages += 1
        return super()._alltoallv(send, send_counts, recv_counts)


SCHEMES: dict[str, tuple[str, dict[str, Any]]] = {
    "allgather": ("allgather", {}),
    "reduce-broadcast": ("reduce-broadcast", {}),
    "reduce-broadcast-overlap": ("reduce-broadcast", {"overlap": 3}),
    "parameter-server": ("parameter-server", {"down": {"name": "adaptive"}}),
    "gossip": ("gossip", {"algorithm": "choco", "topology": "ring", "gamma": 0.5}),
    "push-sum": ("push-sum", {"topology": "exponential"}),
    "simulated": ("simulated-lowprec", {}),
}
MEMORYLESS = {  # gossip and push-sum refuse compressors with their own error feedback
    "topk": {"name": "topk", "ratio": 0.01, "error_feedback": False},
    "adaptive": {"name": "adaptive"},
    "fixedpoint": {"name": "fixedpoint", "bits": 6},
    "qsgd-tensor": {"name": "qsgd", "bits": 4, "bucket_size": 64, "align": "tensor"},
}


def _run_scheme(
    k: int, scheme: str, params: dict[str, Any], make: Callable[[], Compressor], tensors: Any
) -> list[torch.Tensor]:
    n = sum(TENSORS)

    def rank_main(cm: ThreadComm) -> torch.Tensor:
        agg = aggregate.build(scheme, cm, make(), n, OFFSET, params, tensors=tensors)
        timer = PhaseTimer(torch.device("cpu"))
        x = _x(n, seed=cm.rank)
        for step in range(2):
            timer.start()
            out = agg.aggregate(_x(n, seed=10 * step + cm.rank), step, timer).clone()
            agg.after_step(x, step, timer)
        return out if scheme not in ("gossip", "push-sum") else x

    return run_ranks(k, rank_main, _Counting)


@pytest.mark.parametrize("scheme", list(SCHEMES), ids=list(SCHEMES))
@pytest.mark.parametrize("spec", list(MEMORYLESS.values()), ids=list(MEMORYLESS))
def test_no_encode_straddles_a_tensor_and_messages_do_not_multiply(
    scheme: str, spec: dict[str, Any]
) -> None:
    name, params = SCHEMES[scheme]
    k = 3
    calls: list[tuple[int, int]] = []
    _Counting.messages = 0
    _run_scheme(k, name, params, lambda: _spied(spec, calls), TENSORS)
    per_tensor_messages = _Counting.messages
    assert calls and all(_inside_one_tensor(o, n) for o, n in calls), calls
    # every value of the slice went through some encode (each rank's own gradient, stream 0)
    covered = {i for o, n in calls for i in range(o, o + n)}
    assert covered == set(range(OFFSET, OFFSET + sum(TENSORS)))
    # the same exchange with the slice as one tensor: as many messages
    _Counting.messages = 0
    calls.clear()
    _run_scheme(k, name, params, lambda: _spied(spec, calls), None)
    assert _Counting.messages == per_tensor_messages
    assert any(not _inside_one_tensor(o, n) for o, n in calls)  # now they straddle


def test_allgather_result_is_the_mean_of_per_tensor_encodes() -> None:
    spec = MEMORYLESS["adaptive"]
    n, k = sum(TENSORS), 2
    got = _run_scheme(k, "allgather", {}, lambda: from_spec(spec, seed=2), TENSORS)
    ref = from_spec(spec, seed=2)
    mean = torch.zeros(n)
    for r in range(k):  # step 1, as _run_scheme's last aggregate
        payload = ref.encode(_x(n, 10 + r), step=1, rank=r, offset=OFFSET, pieces=TENSORS)
        mean += ref.decode(payload)
    torch.testing.assert_close(got[0], mean / k, rtol=0, atol=1e-6)


def test_reduce_broadcast_cuts_owner_ranges_into_pieces() -> None:
    """K = 2 by hand: owner 0 holds [0, 581), owner 1 [581, 1163) (even split, align 1); owner 0's
    range is pieces [50, 531], owner 1's [169, 13, 400]. One step, per-tensor top-k."""
    spec = {"name": "topk", "ratio": 0.01, "error_feedback": False}
    n, k = sum(TENSORS), 2
    assert n // 2 == 581

    def one_step(cm: ThreadComm) -> torch.Tensor:
        agg = aggregate.build("reduce-broadcast", cm, from_spec(spec), n, OFFSET, tensors=TENSORS)
        timer = PhaseTimer(torch.device("cpu"))
        timer.start()
        return agg.aggregate(_x(n, seed=cm.rank), 0, timer).clone()

    got = run_ranks(k, one_step)
    ref = from_spec(spec)
    expected = torch.zeros(n)
    for (a, b), pieces, owner in (((0, 581), [50, 531], 0), ((581, n), [169, 13, 400], 1)):
        mean = torch.zeros(b - a)
        for r in range(k):
            mean += ref.decode(ref.encode(_x(n, r)[a:b], rank=r, offset=OFFSET + a, pieces=pieces))
        mean /= k
        again = ref.encode(mean, rank=owner, stream=1, offset=OFFSET + a, pieces=pieces)
        assert [p.numel for p in again.parts] == pieces
        expected[a:b] = ref.decode(again)
    for r in range(k):
        torch.testing.assert_close(got[r], expected, rtol=0, atol=0)


def test_async_gradient_codec_encodes_each_tensor() -> None:
    calls: list[tuple[int, int]] = []
    c = _spied(MEMORYLESS["fixedpoint"], calls)
    n = sum(TENSORS)
    codec = GradientCodec([(slice(OFFSET, OFFSET + n), c, TENSORS)], None)
    grad = torch.zeros(OFFSET + n)
    grad[OFFSET:] = _x(n)
    wires = codec.encode(grad, step=0, rank=1)
    assert [(o, m) for o, m in calls] == [
        (OFFSET, 50), (OFFSET + 50, 700), (OFFSET + 750, 13), (OFFSET + 763, 400),
    ]  # fmt: skip
    assert wires[0].numel() == catalog.compressor(MEMORYLESS["fixedpoint"]).wire_bytes(n, TENSORS)
    out = torch.zeros(OFFSET + n)
    codec.decode(torch.cat(wires), [w.numel() for w in wires], out)
    assert float((out[OFFSET:] - grad[OFFSET:]).abs().max()) < float(grad.abs().max()) / 16
