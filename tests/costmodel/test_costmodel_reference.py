"""The cost model against expectations written by hand from the schemes' definitions.

Wire bytes, message steps and codec work of every scheme the model knows, per world size
K in {2, 4, 8}, compressor and overlap, as literal numbers (the arithmetic in the comments);
then fits on synthetic timings generated from ``tests/costmodel_reference.py`` (hand-written
formulas, no qbench import) must recover the chosen parameters and predict new
configurations. No expectation here is computed by ``qbench.costmodel``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

# The model's public entry points, in one place (a move of qbench.costmodel is a one-line edit).
from qbench import catalog
from qbench.catalog import CompressorSpec
from qbench.cli.cost.configs import scheme_option
from qbench.costmodel import (
    COMM_SCHEMA,
    KERNELS_SCHEMA,
    Config,
    CostModel,
    Scheme,
    codec_units,
    collective_msgs,
    collective_time,
    collective_wire,
    comm_plan,
    fit,
    int_sum_bytes,
    payload_bits,
    predict,
)
from qbench.errors import UserError
from qbench.spec.network import Link
from tests import costmodel_reference as ref


def spec(label: str) -> CompressorSpec:
    """The catalog's compressor behind a label (the model takes specs, tables name labels)."""
    return catalog.from_label(label)


UNSHAPED = Link()

N = 4096
"""Gradient values of the literal tables: 16 KiB in fp32."""
Q4, Q6, Q8 = "qsgd-4b-b512", "qsgd-6b-b512", "qsgd-8b-b512"
Q4_BITS = 4 + 32 / 512  # 4-bit levels + one fp32 scale per 512 values: 2048 + 32 = 2080 bytes
KS = (2, 4, 8)

# id: (scheme, compressor, bits per value, backend, n, collective, {K: (msgs, calls)})
# Ring allreduce of S bytes: 2 (K-1) steps of S / K each, so 2 (K-1)/K S = S, 1.5 S, 1.75 S.
PerK = dict[int, tuple[float, tuple[float, ...]]]
PLANS: dict[str, tuple[str, str, float, str, int, str, PerK]] = {
    # fp32: S = 4 N = 16384
    "allreduce-fp32": ("allreduce", "fp32", 32, "gloo", N, "allreduce",
                       {2: (2, (16384,)), 4: (6, (24576,)), 8: (14, (28672,))}),
    # fp16 cast: S = 2 N = 8192
    "allreduce-fp16": ("allreduce", "fp16", 16, "gloo", N, "allreduce-fp16",
                       {2: (2, (8192,)), 4: (6, (12288,)), 8: (14, (14336,))}),
    "allreduce-bf16": ("allreduce", "bf16", 16, "mpi", N, "allreduce-bf16",
                       {2: (2, (8192,)), 4: (6, (12288,)), 8: (14, (14336,))}),
    # projected native low precision: an allreduce of P = 2080 bytes itself
    "lowprec-allreduce-q4": ("lowprec-allreduce", Q4, Q4_BITS, "gloo", N, "allreduce",
                             {2: (2, (2080,)), 4: (6, (3120,)), 8: (14, (3640,))}),
    # simulated: an fp32 buffer of ceil(P / 4) elements; P = 2080 is already a multiple of 4
    "simulated-lowprec-q4": ("simulated-lowprec", Q4, Q4_BITS, "gloo", N, "allreduce",
                             {2: (2, (2080,)), 4: (6, (3120,)), 8: (14, (3640,))}),
    # fp16 of 4097 values: P = 8194 bytes, padded to 2049 floats = 8196 bytes
    "simulated-lowprec-fp16-odd": ("simulated-lowprec", "fp16", 16, "gloo", 4097, "allreduce",
                                   {2: (2, (8196,)), 4: (6, (12294,)), 8: (14, (14343,))}),
    # fixed 8 bits of 4097 values: P = 4097, padded to 1025 floats = 4100 bytes
    "simulated-lowprec-fixed8-odd": ("simulated-lowprec", "fixed-8b", 8, "gloo", 4097,
                                     "allreduce",
                                     {2: (2, (4100,)), 4: (6, (6150,)), 8: (14, (7175,))}),
    # the projection does not pad: 8194 bytes
    "lowprec-allreduce-fp16-odd": ("lowprec-allreduce", "fp16", 16, "gloo", 4097, "allreduce",
                                   {2: (2, (8194,)), 4: (6, (12291,)), 8: (14, (14339.5,))}),
    # alltoallv of the K-1 ranges others own, (K-1)/K P; allgatherv of the own range P/K to
    # K-1 peers, the same; (K-1) + (K-1) steps. P = 2080.
    "reduce-broadcast-q4": ("reduce-broadcast", Q4, Q4_BITS, "gloo", N, "exchange",
                            {2: (2, (1040, 1040)), 4: (6, (1560, 1560)),
                             8: (14, (1820, 1820))}),
    "reduce-broadcast-fp32": ("reduce-broadcast", "fp32", 32, "mpi", N, "exchange",
                              {2: (2, (8192, 8192)), 4: (6, (12288, 12288)),
                               8: (14, (14336, 14336))}),
    # 4 chunks in one stream: 4 x 2 (K-1) steps, one call of 2 (K-1)/K P
    "reduce-broadcast-q4+overlap4": ("reduce-broadcast:overlap=4", Q4, Q4_BITS, "gloo", N,
                                     "exchange+overlap",
                                     {2: (8, (2080,)), 4: (24, (3120,)), 8: (56, (3640,))}),
    # overlap 2, the smallest pipeline: 2 x 2 (K-1) steps, still one call
    "reduce-broadcast-q4+overlap2": ("reduce-broadcast:overlap=2", Q4, Q4_BITS, "gloo", N,
                                     "exchange+overlap",
                                     {2: (4, (2080,)), 4: (12, (3120,)), 8: (28, (3640,))}),
    # the whole payload to each of the K-1 peers, K-1 steps
    "allgather-q4": ("allgather", Q4, Q4_BITS, "gloo", N, "allgather",
                     {2: (1, (2080,)), 4: (3, (6240,)), 8: (7, (14560,))}),
    "allgather-fp32": ("allgather", "fp32", 32, "gloo", N, "allgather",
                       {2: (1, (16384,)), 4: (3, (49152,)), 8: (7, (114688,))}),
    # two ring allreduces: the fp32 scales, 8 buckets x 4 = 32 bytes, and the integers.
    # 4 bits: level 7, K x 7 <= 56 fits int8 at every K here: 4096 bytes.
    "integer-allreduce-q4-gloo": ("integer-allreduce", Q4, Q4_BITS, "gloo", N, "allreduce-int",
                                  {2: (4, (32, 4096)), 4: (12, (48, 6144)),
                                   8: (28, (56, 7168))}),
    # 8 bits: level 127, K x 127 >= 254 overflows int8; gloo sums int32 (16384 bytes) ...
    "integer-allreduce-q8-gloo": ("integer-allreduce", Q8, 8 + 32 / 512, "gloo", N,
                                  "allreduce-int",
                                  {2: (4, (32, 16384)), 4: (12, (48, 24576)),
                                   8: (28, (56, 28672))}),
    # ... and MPI int16 (8192 bytes)
    "integer-allreduce-q8-mpi": ("integer-allreduce", Q8, 8 + 32 / 512, "mpi", N,
                                 "allreduce-int",
                                 {2: (4, (32, 8192)), 4: (12, (48, 12288)),
                                  8: (28, (56, 14336))}),
    # 6 bits: level 31; K x 31 = 62, 124 fit int8, 248 at K = 8 needs int16 on MPI
    "integer-allreduce-q6-mpi": ("integer-allreduce", Q6, 6 + 32 / 512, "mpi", N,
                                 "allreduce-int",
                                 {2: (4, (32, 4096)), 4: (12, (48, 6144)),
                                  8: (28, (56, 14336))}),
    # and int32 on gloo
    "integer-allreduce-q6-gloo": ("integer-allreduce", Q6, 6 + 32 / 512, "gloo", N,
                                  "allreduce-int",
                                  {2: (4, (32, 4096)), 4: (12, (48, 6144)),
                                   8: (28, (56, 28672))}),
    # overlap 4: the scales' allreduce once plus 4 chunk allreduces: (1 + 4) x 2 (K-1) steps
    "integer-allreduce-q4+overlap4": ("integer-allreduce:overlap=4", Q4, Q4_BITS, "gloo", N,
                                      "allreduce-int+overlap",
                                      {2: (10, (32, 4096)), 4: (30, (48, 6144)),
                                       8: (70, (56, 7168))}),
    # overlap 2: (1 + 2) x 2 (K-1) steps
    "integer-allreduce-q4+overlap2": ("integer-allreduce:overlap=2", Q4, Q4_BITS, "gloo", N,
                                      "allreduce-int+overlap",
                                      {2: (6, (32, 4096)), 4: (18, (48, 6144)),
                                       8: (42, (56, 7168))}),
    # layers kept in full precision: a plain fp32 allreduce
    "integer-allreduce-fp32": ("integer-allreduce", "fp32", 32, "gloo", N, "allreduce",
                               {2: (2, (16384,)), 4: (6, (24576,)), 8: (14, (28672,))}),
}  # fmt: skip

# scheme: {K: (encode units, decode units)} for N values.
# reduce-broadcast encodes every range (N) and the owner's mean (N / K): 6144, 5120, 4608; it
# decodes the K payloads of its range (N) and all K gathered ranges (N): 8192.
# allgather encodes N and decodes K payloads of N. The others encode and decode N once.
UNITS = {
    "reduce-broadcast": {2: (6144, 8192), 4: (5120, 8192), 8: (4608, 8192)},
    "allgather": {2: (4096, 8192), 4: (4096, 16384), 8: (4096, 32768)},
    "allreduce": {2: (4096, 4096), 4: (4096, 4096), 8: (4096, 4096)},
    "simulated-lowprec": {2: (4096, 4096), 4: (4096, 4096), 8: (4096, 4096)},
    "integer-allreduce": {2: (4096, 4096), 4: (4096, 4096), 8: (4096, 4096)},
    "lowprec-allreduce": {2: (4096, 4096), 4: (4096, 4096), 8: (4096, 4096)},
}

# (scheme, compressor, backend): {K: payload bytes of N values}. integer-allreduce sends its
# integers (N x width) and the 8 fp32 scales (32 bytes); the others the compressor's payload.
PAYLOAD_BYTES = {
    ("integer-allreduce", Q4, "gloo"): {2: 4128, 4: 4128, 8: 4128},
    ("integer-allreduce", Q8, "gloo"): {2: 16416, 4: 16416, 8: 16416},
    ("integer-allreduce", Q8, "mpi"): {2: 8224, 4: 8224, 8: 8224},
    ("integer-allreduce", Q6, "mpi"): {2: 4128, 4: 4128, 8: 8224},
    ("integer-allreduce", Q6, "nccl"): {2: 4128, 4: 4128, 8: 16416},
    ("reduce-broadcast", Q4, "gloo"): {2: 2080, 4: 2080, 8: 2080},
    ("allgather", Q8, "mpi"): {2: 4128, 4: 4128, 8: 4128},
}

# (backend, K, qsgd bits): integer bytes. Level L = 2^(bits-1) - 1; K L must fit the width.
INT_WIDTH = {
    ("gloo", 2, 4): 1, ("gloo", 8, 4): 1, ("gloo", 18, 4): 1,  # 18 x 7 = 126 <= 127
    ("gloo", 19, 4): 4, ("mpi", 19, 4): 2, ("nccl", 19, 4): 4,  # 133: no int16 on gloo/nccl
    ("mpi", 2, 8): 2, ("mpi", 258, 8): 2, ("mpi", 259, 8): 4,  # 258 x 127 = 32766; 259: 32893
    ("gloo", 2, 2): 1, ("gloo", 127, 2): 1, ("gloo", 128, 2): 4,  # level 1: K itself
}  # fmt: skip


def _case(name: str, k: int) -> tuple[str, str, float, str, int, str, float, tuple[float, ...]]:
    scheme, comp, bits, backend, n, key, per_k = PLANS[name]
    msgs, calls = per_k[k]
    return scheme, comp, bits, backend, n, key, msgs, calls


# -- the model's formulas against the literal tables ------------------------------------------
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("name", sorted(PLANS))
def test_comm_plan_matches_the_hand_written_table(name: str, k: int) -> None:
    scheme, comp, bits, backend, n, key, msgs, calls = _case(name, k)
    item = comm_plan(scheme_option(scheme), spec(comp), k, n, bits, backend)
    assert item.collective == key
    assert item.msgs == msgs
    assert item.calls == pytest.approx(calls, rel=1e-12, abs=0)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("scheme", sorted(UNITS))
def test_codec_units_match_the_hand_written_table(scheme: str, k: int) -> None:
    encode, decode = UNITS[scheme][k]
    assert codec_units(scheme, k, N, "encode") == encode
    assert codec_units(scheme, k, N, "decode") == decode


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize(("scheme", "comp", "backend"), sorted(PAYLOAD_BYTES))
def test_payload_bits_match_the_hand_written_table(
    scheme: str, comp: str, backend: str, k: int
) -> None:
    bits = ref.bits_per_value(comp)  # the compressor's own bits, as predict passes them
    got = payload_bits(scheme_option(scheme), spec(comp), bits, backend, k)
    assert got * N / 8 == PAYLOAD_BYTES[scheme, comp, backend][k]


@pytest.mark.parametrize(("backend", "k", "bits"), sorted(INT_WIDTH))
def test_integer_width_matches_the_hand_written_table(backend: str, k: int, bits: int) -> None:
    assert int_sum_bytes(backend, k, (1 << (bits - 1)) - 1) == INT_WIDTH[backend, k, bits]


# kind: {K: (message steps, wire bytes)} of one collective of S = 1000 bytes (the module
# docstring's formulas): ring allreduce 2 (K-1) steps, 2 (K-1)/K S; alltoallv K-1 steps,
# (K-1)/K S; allgatherv of S per rank K-1 steps, (K-1) S; exchange both halves of reduce-broadcast.
COLLECTIVES = {
    "allreduce": {2: (2, 1000), 4: (6, 1500), 8: (14, 1750)},
    "alltoallv": {2: (1, 500), 4: (3, 750), 8: (7, 875)},
    "allgatherv": {2: (1, 1000), 4: (3, 3000), 8: (7, 7000)},
    "exchange": {2: (2, 1000), 4: (6, 1500), 8: (14, 1750)},
}


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("kind", sorted(COLLECTIVES))
def test_collectives_match_the_hand_written_table(kind: str, k: int) -> None:
    msgs, wire = COLLECTIVES[kind][k]
    assert collective_msgs(kind, k) == msgs
    assert collective_wire(kind, k, 1000) == pytest.approx(wire, rel=1e-12)
    # alpha = 1 ms per step, beta = 1 us per byte
    assert collective_time(1e-3, 1e-6, kind, k, 1000) == pytest.approx(
        msgs * 1e-3 + wire * 1e-6, rel=1e-12
    )


def test_plans_the_model_cannot_make_are_one_line_errors() -> None:
    with pytest.raises(
        UserError, match=r"integer-allreduce cannot sum fp16: its payload is not integer levels$"
    ):
        comm_plan(scheme_option("integer-allreduce"), spec("fp16"), 2, N, 16, "gloo")
    valid = r"no scheme 'gossip'; valid: allreduce, reduce-broadcast, allgather, "
    with pytest.raises(UserError, match=valid):
        comm_plan(Scheme("gossip"), spec("fp32"), 2, N, 32, "gloo")


# -- the reference module against the same tables (so the fits below rest on checked formulas)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("name", sorted(PLANS))
def test_reference_matches_the_hand_written_table(name: str, k: int) -> None:
    scheme, comp, bits, backend, n, key, msgs, calls = _case(name, k)
    base, _, overlap = scheme.partition(":overlap=")
    got = ref.comm(base, comp, k, n, backend, int(overlap or 1), bits)
    assert (got.key, got.msgs) == (key, msgs)
    assert got.calls == pytest.approx(calls, rel=1e-12, abs=0)
    units = tuple(ref.codec_units(base, k, N, op) for op in ("encode", "decode"))
    assert units == UNITS[base][k]


def test_reference_payloads_and_widths_match_the_tables() -> None:
    for (scheme, comp, backend), per_k in PAYLOAD_BYTES.items():
        for k, nbytes in per_k.items():
            assert ref.payload_bits(scheme, comp, backend, k) * N / 8 == nbytes
    for (backend, k, bits), width in INT_WIDTH.items():
        assert ref.int_width(backend, k, bits) == width


# -- fits on timings generated from the hand-written formulas -------------------------------
ALPHA = {
    "allreduce": 50e-6, "allreduce-fp16": 45e-6, "exchange": 80e-6, "allgather": 70e-6,
    "allreduce-int": 40e-6, "exchange+overlap": 60e-6, "allreduce-int+overlap": 30e-6,
}  # fmt: skip
"""Seconds per message step of each fitted collective."""
BETA = {
    "allreduce": 8e-9, "allreduce-fp16": 9e-9, "exchange": 16e-9, "allgather": 12e-9,
    "allreduce-int": 10e-9, "exchange+overlap": 14e-9, "allreduce-int+overlap": 11e-9,
}  # fmt: skip
"""Seconds per wire byte (about 1 Gbit/s)."""
CODEC = {
    ("allreduce", "fp32"): {"encode": (0.0, 0.0), "decode": (5e-6, 0.2e-9)},
    ("allreduce", "fp16"): {"encode": (8e-6, 0.3e-9), "decode": (6e-6, 0.4e-9)},
    ("reduce-broadcast", Q4): {"encode": (20e-6, 0.7e-9), "decode": (10e-6, 0.5e-9)},
    ("allgather", Q4): {"encode": (15e-6, 0.6e-9), "decode": (12e-6, 0.45e-9)},
    ("integer-allreduce", Q4): {"encode": (25e-6, 0.8e-9), "decode": (9e-6, 0.3e-9)},
    ("integer-allreduce", Q8): {"encode": (26e-6, 0.9e-9), "decode": (9e-6, 0.35e-9)},
}
"""(c0 seconds, c1 seconds per unit) of each synchronised scheme's encode and decode."""
FIT_SIZES = tuple(4**i * 4096 for i in range(7))  # bytes of fp32 gradient: 4 KiB .. 16 MiB
OVERLAPS = (4, 8)


def _codec_s(scheme: str, comp: str, k: int, n: float, op: str) -> float:
    c0, c1 = CODEC[scheme, comp][op]
    return c0 + c1 * ref.codec_units(scheme, k, n, op)


def bench_rows(world_sizes: tuple[int, ...] = KS) -> list[dict[str, Any]]:
    """``qbench bench comm --json`` rows whose times follow the hand-written formulas exactly:
    synchronised rows with their phases, pipelined rows with the iteration time only."""
    rows = []
    for k in world_sizes:
        for nbytes in FIT_SIZES:
            n = nbytes // 4
            for scheme, comp in CODEC:
                c = ref.comm(scheme, comp, k, n)
                enc, dec = (_codec_s(scheme, comp, k, n, op) for op in ("encode", "decode"))
                t_comm = ref.comm_seconds(ALPHA[c.key], BETA[c.key], c)
                rows.append(_row(scheme, comp, k, nbytes, c.wire, enc + t_comm + dec,
                                 (enc, t_comm, dec)))  # fmt: skip
                if scheme not in ("reduce-broadcast", "integer-allreduce"):
                    continue
                for overlap in OVERLAPS:  # pipelined: comm + the fill and drain (enc + dec) / C
                    p = ref.comm(scheme, comp, k, n, overlap=overlap)
                    t_pipe = ref.comm_seconds(ALPHA[p.key], BETA[p.key], p)
                    assert t_pipe >= enc + dec  # comm-bound: the rows the model fits on
                    rows.append(_row(f"{scheme}+overlap{overlap}", comp, k, nbytes, p.wire,
                                     t_pipe + (enc + dec) / overlap, None))  # fmt: skip
    return rows


def _row(scheme: str, comp: str, k: int, nbytes: int, wire: float, time_s: float,
         phases: tuple[float, float, float] | None) -> dict[str, Any]:  # fmt: skip
    enc, t_comm, dec = phases if phases is not None else (None, None, None)
    n = nbytes // 4
    return {
        "backend": "gloo", "world_size": k, "network": "unshaped", "scheme": scheme,
        "compressor": comp, "bytes": nbytes, "time_s": time_s, "t_encode_s": enc,
        "t_comm_s": t_comm, "t_decode_s": dec, "wire_bytes": wire,
        "payload_bytes": n * ref.payload_bits(scheme.split("+")[0], comp, "gloo", k) / 8,
        "bits_per_value": ref.payload_bits(scheme.split("+")[0], comp, "gloo", k),
    }  # fmt: skip


@pytest.fixture(scope="module")
def fitted() -> CostModel:
    return fit(comm_docs=[({"schema": COMM_SCHEMA, "rows": bench_rows()}, "reference")])


@pytest.mark.parametrize("key", sorted(ALPHA))
def test_fit_recovers_alpha_and_beta_of_every_collective(fitted: CostModel, key: str) -> None:
    (c,) = [c for c in fitted.collectives if c.collective == key]
    assert c.alpha_s == pytest.approx(ALPHA[key], rel=1e-6)
    assert c.beta_s_per_byte == pytest.approx(BETA[key], rel=1e-6)
    assert c.credit_s == 0.0  # unshaped: no token bucket


@pytest.mark.parametrize(("scheme", "comp"), sorted(CODEC))
def test_fit_recovers_the_codec_constants(fitted: CostModel, scheme: str, comp: str) -> None:
    for op in ("encode", "decode"):
        (p,) = [p for p in fitted.phases if (p.scheme, p.compressor, p.op) == (scheme, comp, op)]
        c0, c1 = CODEC[scheme, comp][op]
        assert p.c0_s == pytest.approx(c0, rel=1e-6, abs=1e-12), op
        assert p.c1_s == pytest.approx(c1, rel=1e-6, abs=1e-18), op


# Configurations the fit never saw: K = 16 and 32 (integer-allreduce's 4-bit levels overflow
# int8 at 32 x 7 = 224 and go to int32 on gloo), 8 Mi values.
PREDICT_KS = (16, 32)
PREDICT_N = 2**23


@pytest.mark.parametrize("k", PREDICT_KS)
@pytest.mark.parametrize(("scheme", "comp"), sorted(CODEC))
def test_predictions_follow_the_hand_written_formulas(
    fitted: CostModel, scheme: str, comp: str, k: int
) -> None:
    cfg = Config(scheme=scheme_option(scheme), compressor=spec(comp), backend="gloo",
                 network=UNSHAPED, world_size=k, numel=PREDICT_N, compute_s=0.0,
                 step_s=0.0)  # fmt: skip
    p = predict(fitted, cfg)
    c = ref.comm(scheme, comp, k, PREDICT_N)
    enc, dec = (_codec_s(scheme, comp, k, PREDICT_N, op) for op in ("encode", "decode"))
    assert p.wire_bytes == pytest.approx(c.wire, rel=1e-9)
    assert p.comm_s == pytest.approx(ref.comm_seconds(ALPHA[c.key], BETA[c.key], c), rel=1e-6)
    assert (p.encode_s, p.decode_s) == (pytest.approx(enc, rel=1e-6), pytest.approx(dec, rel=1e-6))
    assert p.total_s == pytest.approx(enc + p.comm_s + dec, rel=1e-9)


@pytest.mark.parametrize("k", PREDICT_KS)
@pytest.mark.parametrize("scheme", ["reduce-broadcast", "integer-allreduce"])
def test_pipelined_predictions_follow_the_hand_written_formulas(
    fitted: CostModel, scheme: str, k: int
) -> None:
    """overlap 16: comm pays 16 chunks' messages; total = max(codec, comm) + codec / 16."""
    cfg = Config(scheme=scheme_option(f"{scheme}:overlap=16"), compressor=spec(Q4),
                 network=UNSHAPED, world_size=k, numel=PREDICT_N, compute_s=0.0,
                 step_s=0.0)  # fmt: skip
    p = predict(fitted, cfg)
    c = ref.comm(scheme, Q4, k, PREDICT_N, overlap=16)
    comm_s = ref.comm_seconds(ALPHA[c.key], BETA[c.key], c)
    codec = sum(_codec_s(scheme, Q4, k, PREDICT_N, op) for op in ("encode", "decode"))
    assert p.wire_bytes == pytest.approx(c.wire, rel=1e-9)
    assert p.comm_s == pytest.approx(comm_s, rel=1e-6)
    assert p.total_s == pytest.approx(max(codec, comm_s) + codec / 16, rel=1e-6)


@pytest.mark.parametrize("k", KS)
def test_simulated_lowprec_prediction_pays_the_padded_buffer(fitted: CostModel, k: int) -> None:
    """4097 fp16 values: 8194 payload bytes travel as 2049 floats (8196 bytes) on the fp32
    allreduce's alpha and beta."""
    cfg = Config(scheme=Scheme("simulated-lowprec"), compressor=spec("fp16"), network=UNSHAPED,
                 world_size=k, numel=4097, compute_s=0.0, step_s=0.0)  # fmt: skip
    p = predict(fitted, cfg)
    wire = 2 * (k - 1) / k * 8196
    assert p.wire_bytes == pytest.approx(wire, rel=1e-12)
    assert p.comm_s == pytest.approx(2 * (k - 1) * ALPHA["allreduce"] + wire * BETA["allreduce"],
                                     rel=1e-6)  # fmt: skip


# -- codec composed from bench kernels (no phase timings of the scheme) ---------------------
KERNEL = {Q4: {"encode": (30e-6, 1.1e-9), "decode": (20e-6, 0.9e-9)},
          "fp16": {"encode": (4e-6, 0.25e-9), "decode": (3e-6, 0.2e-9)}}  # fmt: skip
"""(c0 seconds per call, c1 seconds per element) of one encode or decode call."""
COPY = (1e-6, 0.1e-9)
"""An elementwise pass (the divide by K, zeroing)."""


@pytest.fixture(scope="module")
def from_kernels() -> CostModel:
    """Collectives from phase-less bench rows, codec from kernel timings only."""
    rows = [dict(r, t_encode_s=None, t_decode_s=None) for r in bench_rows((2,))]
    krows = [
        {"compressor": comp, "op": op, "numel": numel, "device": "cpu",
         "seconds": c0 + c1 * numel, "copy_seconds": COPY[0] + COPY[1] * numel}
        for comp, ops in KERNEL.items() for op, (c0, c1) in ops.items()
        for numel in (2**16, 2**20, 2**24)
    ]  # fmt: skip
    return fit(comm_docs=[({"schema": COMM_SCHEMA, "rows": rows}, "comm")],
               kernel_docs=[({"schema": KERNELS_SCHEMA, "rows": krows}, "kernels")])  # fmt: skip


def _kernel_s(comp: str, op: str, elements: float, calls: int) -> float:
    c0, c1 = KERNEL[comp][op]
    return calls * c0 + c1 * elements


def _pass_s(n: float) -> float:
    return COPY[0] + COPY[1] * n


@pytest.mark.parametrize("k", KS)
def test_codec_composed_from_kernel_timings(from_kernels: CostModel, k: int) -> None:
    """Calls and elements of each scheme's encode and decode, from the scheme definitions:
    reduce-broadcast encodes K ranges and the owner's mean (K + 1 calls over n (K+1)/K) and
    decodes K received and K gathered ranges (2K calls over 2n) plus the elementwise pass;
    allgather decodes K payloads of n (K calls) plus the pass; allreduce fp16 casts once each
    way plus the divide; simulated-lowprec and the projection encode and decode n once."""
    n = 2**20
    want = {
        ("reduce-broadcast", Q4): (_kernel_s(Q4, "encode", (k + 1) * n / k, k + 1),
                                   _kernel_s(Q4, "decode", 2 * n, 2 * k) + _pass_s(n)),
        ("allgather", Q4): (_kernel_s(Q4, "encode", n, 1),
                            _kernel_s(Q4, "decode", k * n, k) + _pass_s(n)),
        ("allreduce", "fp16"): (_kernel_s("fp16", "encode", n, 1),
                                _kernel_s("fp16", "decode", n, 1) + _pass_s(n)),
        ("simulated-lowprec", Q4): (_kernel_s(Q4, "encode", n, 1),
                                    _kernel_s(Q4, "decode", n, 1)),
        ("lowprec-allreduce", Q4): (_kernel_s(Q4, "encode", n, 1),
                                    _kernel_s(Q4, "decode", n, 1)),
    }  # fmt: skip
    for (scheme, comp), (enc, dec) in want.items():
        cfg = Config(scheme=scheme_option(scheme), compressor=spec(comp), network=UNSHAPED,
                     world_size=k, numel=n, compute_s=0.0, step_s=0.0)  # fmt: skip
        p = predict(from_kernels, cfg)
        assert p.encode_s == pytest.approx(enc, rel=1e-6), scheme
        assert p.decode_s == pytest.approx(dec, rel=1e-6), scheme
        assert math.isfinite(p.total_s)


# -- a recorded hierarchical scheme and a pipelined one per bucket (issue 44's re-run) ----------
def test_a_recorded_hierarchical_scheme_keeps_its_levels() -> None:
    given = Scheme.of(
        catalog.scheme({"name": "hierarchical", "intra": "bf16", "inter": "allgather"})
    )
    assert (given.name, given.intra, given.inter, given.backward) == (
        "hierarchical", "bf16", "allgather", False
    )  # fmt: skip
    default = Scheme.of(catalog.scheme({"name": "hierarchical"}))
    assert (default.intra, default.inter) == ("none", "reduce-scatter")


def test_no_hierarchical_per_bucket_nor_a_pipeline_per_bucket() -> None:
    with pytest.raises(UserError) as got:
        Scheme.of(catalog.scheme({"name": "hierarchical", "backward": True}))
    assert str(got.value) == "scheme hierarchical: the cost model has no per-bucket hierarchical"
    # the smallest pipeline, 2 chunks, is one too
    with pytest.raises(UserError) as got:
        Scheme("reduce-broadcast", 2).per_bucket("backward")
    assert str(got.value) == "scheme reduce-broadcast: the cost model has no per-bucket pipeline"
