"""allgather, parameter-server, simulated-lowprec, integer-allreduce and 16-bit allreduce.

Multi-process tests (marked slow) run every case of one backend and world size in ONE launch of
tests/dist_schemes_prog.py and compare with single-process references built from the same
encoders and keys. The fast tests (no processes) cover parameter checks, the integer dtype
choice, the matrix's exclusions, and each scheme on a one-rank loopback communicator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from qbench import aggregate, catalog
from qbench.aggregate.integer_allreduce import sum_dtype
from qbench.comm import allreduce_bus_bytes
from qbench.comm.base import Comm
from qbench.compress import Key, from_spec
from qbench.compress import blockscale as bs
from qbench.compress.kernels.buckets import buckets
from qbench.compress.kernels.draws import uniform
from qbench.compress.lowfloat import ScaledFloat
from qbench.errors import UserError
from qbench.spec.rules import incompatibility
from qbench.timing import PhaseTimer
from tests.dist_schemes_prog import make_gradient
from tests.distributed import here, launch

NUMEL = 10_007  # odd on purpose: partial buckets, partial bytes, payloads not a multiple of 4
STEPS = 3
UNBIASED_STEPS = 200

QSGD4 = {"name": "qsgd", "bits": 4, "bucket_size": 512}
QSGD8 = {"name": "qsgd", "bits": 8, "bucket_size": 256}
ADAPTIVE = {"name": "adaptive"}  # data-dependent sizes: exercises every size exchange
TOPK = {"name": "topk", "ratio": 0.05}  # error feedback: state carried across steps
COARSE = {"name": "qsgd", "bits": 2, "bucket_size": 16}  # levels -1, 0, 1: large variance
MXFP4_SR = {"name": "mx", "element": "e2m1", "rounding": "stochastic"}
FP8_BLOCK = {"name": "fp8", "block_size": 128}


def _case(id_: str, scheme: str, comp: dict, **kw: Any) -> dict[str, Any]:
    return {"id": id_, "scheme": scheme, "comp": comp, "params": {}, "numel": NUMEL,
            "steps": STEPS, "grad": "randn", **kw}  # fmt: skip


def _extreme(bits: int) -> dict[str, Any]:
    comp = {"name": "qsgd", "bits": bits, "bucket_size": 64}
    return _case(
        f"int-extreme{bits}", "integer-allreduce", comp, numel=1000, steps=1, grad="extreme"
    )


CASES = [
    _case("ag-none", "allgather", {"name": "none"}),
    _case("ag-qsgd", "allgather", QSGD4),
    _case("ag-adaptive", "allgather", ADAPTIVE),
    _case("ps-none", "parameter-server", {"name": "none"}),
    _case("ps-qsgd", "parameter-server", QSGD4, params={"down": QSGD8}),
    _case("ps-adaptive", "parameter-server", ADAPTIVE, params={"down": ADAPTIVE}),
    _case("ps-topk", "parameter-server", TOPK, params={"down": {"name": "topk", "ratio": 0.1}}),
    _case("sim-qsgd", "simulated-lowprec", {"name": "qsgd", "bits": 3, "bucket_size": 512}),
    _case("sim-adaptive", "simulated-lowprec", ADAPTIVE),
    _case("int-qsgd4", "integer-allreduce", {"name": "qsgd", "bits": 4, "bucket_size": 128}),
    _case("int-qsgd8", "integer-allreduce", QSGD8),
    _case(  # pipelined: 5 chunks of whole buckets, same integers as one allreduce
        "int-qsgd4-overlap",
        "integer-allreduce",
        {"name": "qsgd", "bits": 4, "bucket_size": 128},
        params={"overlap": 5},
    ),
    _case(
        "int-unbiased", "integer-allreduce", COARSE, numel=64, steps=UNBIASED_STEPS, grad="fixed"
    ),
    _case("ar-fp16", "allreduce", {"name": "fp16"}),
    _case("ar-bf16", "allreduce", {"name": "bf16"}),
    # the low-precision float formats: codes on shared block scales, summed as integers
    _case("int-mxfp4", "integer-allreduce", MXFP4_SR),
    _case("int-nvfp4", "integer-allreduce", {"name": "nvfp4", "scope": "global"}),
    _case("int-fp8", "integer-allreduce", FP8_BLOCK, params={"overlap": 3}),
    _case("ag-mxfp6", "allgather", {"name": "mx", "element": "e3m2", "error_feedback": True}),
    _case("ps-nvfp4", "parameter-server", {"name": "nvfp4"}, params={"down": FP8_BLOCK}),
]
CASES_4 = [
    _case("ag-qsgd", "allgather", QSGD4),
    _case("ps-qsgd", "parameter-server", QSGD4, params={"down": QSGD8}),
    # K L = 4 * 127 = 508 needs 16 bits; 4 * 31 = 124 is int8's edge.
    _extreme(8),
    _extreme(6),
]
BY_ID = {c["id"]: c for c in CASES}
BY_ID_4 = {c["id"]: c for c in CASES_4}
BACKENDS = ["gloo", "mpi"]

Ranks = list[dict[str, Any]]


# -- launching ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ranks_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], Ranks]:
    """(backend, world) -> per rank {case id: record}; one launch per pair, failures cached."""
    cache: dict[tuple[str, int], Any] = {}

    def get(backend: str, world: int) -> Ranks:
        if (backend, world) not in cache:
            cases = CASES if world == 2 else CASES_4
            cases = [
                c
                for c in cases
                if incompatibility(backend, c["scheme"], catalog.compressor(c["comp"])) is None
            ]
            out = tmp_path_factory.mktemp(f"{backend}-w{world}")
            argv = [here("dist_schemes_prog.py"), backend, json.dumps(cases), str(out)]
            try:
                launch(backend, world, argv, timeout=180)
                cache[backend, world] = [torch.load(out / f"rank-{r}.pt") for r in range(world)]
            except AssertionError as e:
                cache[backend, world] = e
        got = cache[backend, world]
        if isinstance(got, AssertionError):
            raise got
        return got

    return get


def records(
    ranks_of: Callable[[str, int], Ranks], backend: str, id_: str, world: int = 2
) -> list[dict[str, Any]]:
    return [r[id_] for r in ranks_of(backend, world)]


def grads(case: dict[str, Any], world: int, step: int) -> list[torch.Tensor]:
    bucket = int(case["comp"].get("bucket_size", 1))
    return [make_gradient(case["grad"], r, step, case["numel"], bucket) for r in range(world)]


def exact_mean(case: dict[str, Any], world: int, step: int) -> torch.Tensor:
    return torch.stack(grads(case, world, step)).mean(0)


# -- references --------------------------------------------------------------------------------
def ref_allgather(case: dict[str, Any], world: int) -> list[torch.Tensor]:
    enc = [from_spec(case["comp"]) for _ in range(world)]
    out = []
    for step in range(case["steps"]):
        acc = torch.zeros(case["numel"])
        for r, g in enumerate(grads(case, world, step)):
            enc[r].decode(enc[r].encode(g, step=step, rank=r, name="allgather"), out=acc)
        out.append(acc.div_(world))
    return out


def ref_parameter_server(case: dict[str, Any], world: int) -> list[torch.Tensor]:
    up = [from_spec(case["comp"]) for _ in range(world)]
    down = from_spec(case["params"].get("down") or {"name": "none"})
    out = []
    for step in range(case["steps"]):
        acc = torch.zeros(case["numel"])
        for r, g in enumerate(grads(case, world, step)):
            up[r].decode(up[r].encode(g, step=step, rank=r, name="up"), out=acc)
        mean = acc.div_(world)
        out.append(down.decode(down.encode(mean, step=step, rank=0, stream=1, name="down")))
    return out


def ref_integer(case: dict[str, Any], world: int, step: int) -> torch.Tensor:
    """s * (sum_r q_r / (K L)), q_r = floor(t) + [u < frac(t)], t = x L / s, s shared max."""
    comp, n = case["comp"], case["numel"]
    top, size = (1 << (comp["bits"] - 1)) - 1, comp["bucket_size"]
    xs = [buckets(g, size) for g in grads(case, world, step)]
    s = torch.stack([x.abs().amax(dim=1) for x in xs]).amax(0)
    safe = torch.where(s > 0, s, 1.0).unsqueeze(1)
    total = torch.zeros(n, dtype=torch.int64)
    for r, x in enumerate(xs):
        t = (x / safe * top).reshape(-1)[:n]
        u = uniform(Key(seed=0, step=step, rank=r, stream=0), 0, n)
        q = torch.floor(t) + (u < t - torch.floor(t)).float()
        assert q.abs().max() <= top
        total += q.to(torch.int64)
    ratio = buckets(total.float() / torch.full((1,), float(world * top)), size)
    return (ratio * s.unsqueeze(1)).reshape(-1)[:n]


def ref_float_integer(case: dict[str, Any], world: int, step: int) -> torch.Tensor:
    """The mean of each rank's block-scaled values on the shared (MAX) block maxima, in fp64:
    the codes' exact sum."""
    codecs = [c for _ in range(world) if isinstance(c := from_spec(case["comp"]), ScaledFloat)]
    scaling = codecs[0].scaling
    xs = grads(case, world, step)
    block = scaling.block
    amax = torch.stack([bs.blocks(x, block).abs().amax(dim=1) for x in xs]).amax(0)
    divisor = scaling.divisors(*scaling.scales(amax)).double()[:, None]
    total = torch.zeros(case["numel"], dtype=torch.float64)
    for r, (codec, x) in enumerate(zip(codecs, xs, strict=True)):
        enc = codec.encode_blocks(x, Key(seed=0, step=step, rank=r, stream=0), 0, amax)
        values = scaling.element.decode(enc.codes).double().view(-1, block) * divisor
        total += values.reshape(-1)[: x.numel()]
    return (total / world).float()


# -- multi-process tests -------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("id_", ["ag-none", "ps-none"])
def test_fp32_equals_exact_mean(ranks_of, backend: str, id_: str) -> None:
    case = BY_ID[id_]
    for rec in records(ranks_of, backend, id_):
        for step in range(STEPS):
            exact = exact_mean(case, 2, step)
            torch.testing.assert_close(rec["results"][step], exact, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("id_", ["ag-qsgd", "ag-adaptive", "ag-mxfp6"])
def test_allgather_matches_reference(ranks_of, backend: str, id_: str) -> None:
    case, world = BY_ID[id_], 2
    ref = ref_allgather(case, world)
    recs = records(ranks_of, backend, id_)
    for rec in recs:
        for step in range(STEPS):
            torch.testing.assert_close(rec["results"][step], ref[step], rtol=1e-5, atol=1e-6)
    if id_ == "ag-qsgd":  # (K-1) copies of the own payload per step
        wire = from_spec(case["comp"]).wire_nbytes(NUMEL)
        assert [r["bytes_sent"] for r in recs] == [STEPS * (world - 1) * wire] * world
        assert recs[0]["payload_bytes"] == wire


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("id_", ["ps-none", "ps-qsgd", "ps-adaptive", "ps-topk", "ps-nvfp4"])
def test_parameter_server_matches_reference(ranks_of, backend: str, id_: str) -> None:
    case, world = BY_ID[id_], 2
    ref = ref_parameter_server(case, world)
    recs = records(ranks_of, backend, id_)
    for rec in recs:
        for step in range(STEPS):
            torch.testing.assert_close(rec["results"][step], ref[step], rtol=1e-5, atol=1e-6)
    down = case["params"].get("down") or {"name": "none"}
    if from_spec(down).fixed_size and from_spec(case["comp"]).fixed_size:
        up_bytes = from_spec(case["comp"]).wire_nbytes(NUMEL)
        down_bytes = from_spec(down).wire_nbytes(NUMEL)
        # The server sends K-1 copies of the mean down; every worker sends its payload up.
        assert recs[0]["bytes_sent"] == STEPS * (world - 1) * down_bytes
        assert recs[1]["bytes_sent"] == STEPS * up_bytes


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_four_ranks_allgather_and_parameter_server(ranks_of, backend: str) -> None:
    for id_, ref_of in (("ag-qsgd", ref_allgather), ("ps-qsgd", ref_parameter_server)):
        ref = ref_of(BY_ID_4[id_], 4)
        for rec in records(ranks_of, backend, id_, world=4):
            for step in range(STEPS):
                torch.testing.assert_close(rec["results"][step], ref[step], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("id_", ["sim-qsgd", "sim-adaptive"])
def test_simulated_returns_own_gradient_and_sends_payload_bytes(
    ranks_of, backend: str, id_: str
) -> None:
    case, world = BY_ID[id_], 2
    recs = records(ranks_of, backend, id_)
    max_bytes = [0] * STEPS
    for r, rec in enumerate(recs):
        enc = from_spec(case["comp"])
        for step in range(STEPS):
            payload = enc.encode(grads(case, world, step)[r], step=step, rank=r, name="own")
            torch.testing.assert_close(rec["results"][step], enc.decode(payload), rtol=0, atol=0)
            max_bytes[step] = max(max_bytes[step], payload.nbytes)
    # fp32-typed allreduce of ceil(payload / 4) floats; data-dependent sizes first agree on
    # the largest with one int64 MAX allreduce.
    exchange = allreduce_bus_bytes(8, world) if case["comp"] == ADAPTIVE else 0
    want = sum(exchange + allreduce_bus_bytes(4 * math.ceil(b / 4), world) for b in max_bytes)
    assert [rec["bytes_sent"] for rec in recs] == [want] * world
    if id_ == "sim-qsgd":
        assert max_bytes[0] % 4 != 0  # the padding to whole floats is exercised


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("id_", "dtype"), [("int-qsgd4", {"gloo": "int8", "mpi": "int8"}),
                       ("int-qsgd8", {"gloo": "int32", "mpi": "int16"})],
)  # fmt: skip
def test_integer_allreduce_equals_reference_exactly(
    ranks_of, backend: str, id_: str, dtype: dict[str, str]
) -> None:
    case, world = BY_ID[id_], 2
    recs = records(ranks_of, backend, id_)
    for step in range(STEPS):
        ref = ref_integer(case, world, step)
        for rec in recs:
            assert torch.equal(rec["results"][step], ref)
    item = getattr(torch, dtype[backend]).itemsize
    nb = math.ceil(NUMEL / case["comp"]["bucket_size"])
    assert recs[0]["dtype"] == f"torch.{dtype[backend]}"
    assert recs[0]["payload_bytes"] == NUMEL * item + 4 * nb
    per_step = allreduce_bus_bytes(4 * nb, world) + allreduce_bus_bytes(NUMEL * item, world)
    assert recs[0]["bytes_sent"] == STEPS * per_step


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("id_", "dtype"), [("int-mxfp4", {"gloo": "int8", "mpi": "int8"}),
                       ("int-nvfp4", {"gloo": "int8", "mpi": "int8"}),
                       ("int-fp8", {"gloo": "int32", "mpi": "int32"})],
)  # fmt: skip
def test_integer_allreduce_of_float_formats_is_their_exact_sum(
    ranks_of, backend: str, id_: str, dtype: dict[str, str]
) -> None:
    """MXFP4 (6 = 12 units, 2 ranks: int8), NVFP4 and FP8 E4M3 (448 = 229376 units: int32), the
    last pipelined in 3 chunks: the mean of the ranks' values on shared scales, exactly."""
    case, world = BY_ID[id_], 2
    recs = records(ranks_of, backend, id_)
    for step in range(STEPS):
        ref = ref_float_integer(case, world, step)
        for rec in recs:
            # the same sum in fp64, multiplied in another order: equal to float32's last bit
            assert torch.allclose(rec["results"][step], ref, rtol=2**-23, atol=0)
    assert recs[0]["dtype"] == f"torch.{dtype[backend]}"
    exact = exact_mean(case, world, 0)
    err = float((recs[0]["results"][0] - exact).norm() / exact.norm())
    assert 0 < err < {"int-mxfp4": 0.25, "int-nvfp4": 0.15, "int-fp8": 0.05}[id_]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_allreduce_is_unbiased(ranks_of, backend: str) -> None:
    case = BY_ID["int-unbiased"]
    samples = records(ranks_of, backend, "int-unbiased")[0]["results"].double()
    exact = exact_mean(case, 2, 0).double()
    avg, sd = samples.mean(0), samples.std(0)
    assert sd.max() > 0.1  # bits 2: coarse levels, so the test has power
    se = sd / math.sqrt(UNBIASED_STEPS)
    assert ((avg - exact).abs() <= 5 * se + 1e-6).all()
    z = (avg - exact)[sd > 0] / se[sd > 0]
    assert z.pow(2).mean() < 2.0  # about 1 when unbiased


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("id_", "dtype"), [("int-extreme8", {"gloo": "int32", "mpi": "int16"}),
                       ("int-extreme6", {"gloo": "int8", "mpi": "int8"})],
)  # fmt: skip
def test_integer_allreduce_worst_case_does_not_overflow(
    ranks_of, backend: str, id_: str, dtype: dict[str, str]
) -> None:
    case = BY_ID_4[id_]
    x = grads(case, 4, 0)[0]  # every value +-(its bucket's max) on all 4 ranks: |sum| = 4 L
    assert (x > 0).any() and (x < 0).any()
    for rec in records(ranks_of, backend, id_, world=4):
        assert torch.equal(rec["results"][0], x)
        assert rec["dtype"] == f"torch.{dtype[backend]}"


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("id_", "unit"), [("ar-fp16", 2.0**-11), ("ar-bf16", 2.0**-8)])
def test_allreduce_16bit_equals_mean_to_16bit_tolerance(
    ranks_of, backend: str, id_: str, unit: float
) -> None:
    if incompatibility(backend, "allreduce", catalog.compressor(BY_ID[id_]["comp"])):
        pytest.skip(f"{backend} cannot sum {id_}: excluded by the matrix")
    recs = records(ranks_of, backend, id_)
    for step in range(STEPS):
        gs = torch.stack(grads(BY_ID[id_], 2, step))
        exact = gs.mean(0)
        # One rounding of each input, one of the 16-bit sum (relative to |sum|).
        bound = unit * (gs.abs().mean(0) + exact.abs()) * 1.01 + 1e-7
        for rec in recs:
            assert ((rec["results"][step] - exact).abs() <= bound).all()
    assert recs[0]["payload_bytes"] == 2 * NUMEL
    assert recs[0]["bytes_sent"] == STEPS * allreduce_bus_bytes(2 * NUMEL, 2)


# -- fast tests: no processes ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("world", "top", "backend", "dtype"),
    [
        (2, 7, "gloo", torch.int8),
        (4, 31, "mpi", torch.int8),  # 124 <= 127
        (5, 31, "mpi", torch.int16),  # 155
        (4, 127, "mpi", torch.int16),
        (4, 127, "gloo", torch.int32),  # gloo cannot sum int16
        (4, 127, "nccl", torch.int32),  # NCCL has no int16
        (258, 127, "mpi", torch.int16),  # 32766
        (259, 127, "mpi", torch.int32),
        (2, 32767, "mpi", torch.int32),
    ],
)
def test_sum_dtype_is_narrowest_that_cannot_overflow(
    world: int, top: int, backend: str, dtype: torch.dtype
) -> None:
    assert sum_dtype(world, top, backend) == dtype


def test_sum_dtype_refuses_int32_overflow() -> None:
    with pytest.raises(ValueError, match="overflows int32"):
        sum_dtype(70_000, 32767, "mpi")


def test_parameter_server_params() -> None:
    assert aggregate.check_params("parameter-server", {}) == {"down": None}
    assert aggregate.check_params("parameter-server", {"down": "fp16"}) == {
        "down": {"name": "fp16"}
    }
    assert aggregate.check_params("parameter-server", {"down": QSGD8}) == {"down": QSGD8}


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"dwon": QSGD8}, "unknown parameter 'dwon' .*; valid: down"),
        ({"down": {"name": "qsgd", "bits": 12}}, "bits must be 1..8 or 16, got 12"),
        ({"down": {"name": "qsgx"}}, "unknown compressor 'qsgx'"),
        ({"down": {"name": "qsgd", "bitz": 4}}, "unknown parameter 'bitz'"),
        ({"down": {"bits": 8}}, "down must be a compressor spec with a name"),
        ({"down": 8}, "down must be a compressor spec with a name"),
        ({"down": {"name": "qsgd", "seed": 3}}, "remove `seed`"),
    ],
)
def test_parameter_server_rejects_bad_params(params: dict, match: str) -> None:
    with pytest.raises(UserError, match=match):
        aggregate.check_params("parameter-server", params)


DDP_DEFAULTS = {"backward": False, "bucket_cap_mb": 25.0, "gradient_as_bucket_view": False}


@pytest.mark.parametrize(
    ("scheme", "own", "match"),
    [("allgather", DDP_DEFAULTS, "unknown parameter 'down'; valid: backward, bucket_cap_mb"),
     ("allreduce", DDP_DEFAULTS, "unknown parameter 'down'; valid: backward, bucket_cap_mb"),
     ("simulated-lowprec", {}, "takes no parameters")],
)  # fmt: skip
def test_schemes_without_params_of_their_own(scheme: str, own: dict, match: str) -> None:
    assert aggregate.check_params(scheme, {}) == own  # only the DDP options (docs/ddp.md)
    with pytest.raises(UserError, match=match):
        aggregate.check_params(scheme, {"down": QSGD8})


@pytest.mark.parametrize(
    ("params", "match"),
    [({"down": QSGD8}, "unknown parameter 'down'"), ({"overlap": 0}, "chunk count >= 1"),
     ({"overlap": True}, "chunk count >= 1")],
)  # fmt: skip
def test_integer_allreduce_takes_only_overlap(params: dict, match: str) -> None:
    got = aggregate.check_params("integer-allreduce", {"overlap": 8})
    assert got == {"overlap": 8, **DDP_DEFAULTS}
    assert aggregate.check_params("integer-allreduce", {})["overlap"] == 1
    with pytest.raises(UserError, match=match):
        aggregate.check_params("integer-allreduce", params)


@pytest.mark.parametrize(
    ("backend", "scheme", "comp", "match"),
    [
        ("gloo", "allreduce", QSGD4, "cannot sum packed qsgd"),
        ("mpi", "allreduce", {"name": "bf16"}, "MPI cannot sum bf16"),
        ("gloo", "integer-allreduce", {"name": "onebit"}, "cannot sum onebit"),
        ("gloo", "integer-allreduce", {"name": "qsgd", "bits": 1}, "bits >= 2"),
        ("mpi", "integer-allreduce", {"name": "qsgd", "norm": "l2"}, "norm l2"),
    ],
)
def test_incompatible_combinations_say_why(backend: str, scheme: str, comp: dict, match: str):
    assert match in (incompatibility(backend, scheme, catalog.compressor(comp)) or "")


@pytest.mark.parametrize(
    ("backend", "scheme", "comp"),
    [
        ("gloo", "allreduce", {"name": "fp16"}),
        ("gloo", "allreduce", {"name": "bf16"}),
        ("mpi", "allreduce", {"name": "fp16"}),
        ("mpi", "integer-allreduce", QSGD8),
        ("gloo", "integer-allreduce", {"name": "qsgd", "bits": 4, "layout": "sign"}),
        ("gloo", "integer-allreduce", {"name": "none"}),  # fp32 layers of a qsgd run
        ("mpi", "allgather", {"name": "onebit"}),
        ("mpi", "parameter-server", ADAPTIVE),
        ("gloo", "simulated-lowprec", TOPK),
    ],
)
def test_compatible_combinations(backend: str, scheme: str, comp: dict) -> None:
    assert incompatibility(backend, scheme, catalog.compressor(comp)) is None


class Loopback(Comm):
    """One rank talking to itself: every collective returns what it was given."""

    backend = "gloo"
    rank = 0
    world_size = 1

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        pass

    def _alltoallv(
        self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> torch.Tensor:
        assert list(send_counts) == list(recv_counts)
        return send[: send_counts[0]].clone()

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("scheme", "comp", "params"),
    [
        ("allgather", QSGD4, {}),
        ("allgather", ADAPTIVE, {}),
        ("parameter-server", QSGD4, {"down": QSGD8}),
        ("parameter-server", ADAPTIVE, {"down": ADAPTIVE}),
        ("simulated-lowprec", ADAPTIVE, {}),
        ("integer-allreduce", QSGD4, {}),
        ("integer-allreduce", QSGD4, {"overlap": 3}),
        ("integer-allreduce", {"name": "none"}, {}),
        ("allreduce", {"name": "bf16"}, {}),
    ],
)
def test_one_rank_runs_and_times_every_phase(scheme: str, comp: dict, params: dict) -> None:
    agg = aggregate.build(scheme, Loopback(), from_spec(comp), 1000, params=params)
    g = make_gradient("randn", 0, 0, 1000, 1)
    timer = PhaseTimer(torch.device("cpu"))
    timer.start()
    out = agg.aggregate(g.clone(), 0, timer)
    assert out.shape == g.shape and out.dtype == torch.float32
    assert (out - g).abs().max() < 0.6 * g.abs().max()  # one rank: its own gradient, roughly
    assert timer.totals["comm"] > 0
    # Pipelined schemes interleave phases and mark only comm; the others time decode too.
    assert agg.overlapped == (params.get("overlap", 1) > 1)
    assert agg.overlapped or timer.totals["decode"] > 0
    assert agg.payload_bytes > 0
