"""Bit packing: exact sizes, the documented bit layout, round trips on every width."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qbench.compress.kernels.bitpack import pack, packed_nbytes, unpack

WIDTHS = range(1, 9)
LENGTHS = (0, 1, 7, 8, 9, 1023, 4097)


def _codes(n: int, bits: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 100 + bits)
    return torch.randint(0, 1 << bits, (n,), generator=gen, dtype=torch.int64)


def _reference_pack(codes: list[int], bits: int) -> bytes:
    """Bit by bit, straight from the layout's definition: value i at bits [i*b, (i+1)*b)."""
    out = bytearray((len(codes) * bits + 7) // 8)
    for i, code in enumerate(codes):
        for j in range(bits):
            pos = i * bits + j
            out[pos // 8] |= ((code >> j) & 1) << (pos % 8)
    return bytes(out)


@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("n", LENGTHS)
def test_round_trip_and_exact_size(bits: int, n: int) -> None:
    codes = _codes(n, bits)
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.numel() == packed_nbytes(n, bits) == -(-n * bits // 8)
    unpacked = unpack(packed, bits, n)
    assert unpacked.dtype == torch.uint8
    assert torch.equal(unpacked.to(torch.int64), codes)


@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("n", (1, 5, 8, 13, 37))
def test_layout_matches_definition(bits: int, n: int) -> None:
    codes = _codes(n, bits, seed=1)
    expected = _reference_pack(codes.tolist(), bits)
    assert bytes(pack(codes, bits).tolist()) == expected


def test_hand_examples() -> None:
    assert pack(torch.tensor([1, 0, 1, 1]), 1).tolist() == [0b1101]
    assert pack(torch.tensor([0x3, 0xA, 0x1]), 4).tolist() == [0xA3, 0x01]
    # 3-bit codes 1..7,0 fill exactly 3 bytes; bits 0-2 hold 1, bits 3-5 hold 2, ...
    word = sum(c << (3 * i) for i, c in enumerate([1, 2, 3, 4, 5, 6, 7, 0]))
    assert pack(torch.tensor([1, 2, 3, 4, 5, 6, 7, 0]), 3).tolist() == list(
        word.to_bytes(3, "little")
    )


def test_trailing_padding_bytes_are_dropped() -> None:
    # 9 x 7 bits = 63 bits: one byte fewer than the 2 x 7 bytes of two padded groups of 8.
    assert pack(torch.full((9,), 127), 7).numel() == 8
    assert pack(torch.ones(9, dtype=torch.uint8), 1).tolist() == [0xFF, 0x01]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64, torch.bool])
def test_integer_and_bool_inputs(dtype: torch.dtype) -> None:
    codes = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0, 1]).to(dtype)
    packed = pack(codes, 1)
    assert torch.equal(unpack(packed, 1, 9), codes.to(torch.uint8))


def test_only_low_bits_are_kept() -> None:
    assert torch.equal(
        unpack(pack(torch.tensor([0x1F5, 0x13]), 4), 4, 2), torch.tensor([5, 3]).byte()
    )


@pytest.mark.parametrize("bits", WIDTHS)
def test_only_low_bits_are_kept_at_every_width(bits: int) -> None:
    # 15 set bits above the low `bits` of every code: none of them may reach the stream
    low = [0, 1, (1 << bits) - 1, 0b10101010 & ((1 << bits) - 1)] * 3
    high = [v | (0x7FFF << bits) for v in low]
    assert bytes(pack(torch.tensor(high), bits).tolist()) == _reference_pack(low, bits)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
@pytest.mark.parametrize("bits", WIDTHS)
def test_wide_unsigned_codes_at_every_width(dtype: torch.dtype, bits: int) -> None:
    # torch promotes uint16/32/64 with no other dtype (a shift by an int64 or uint8 table raises),
    # so pack must convert them before shifting, at the byte-aligned and the word widths alike.
    low = [0, 1, (1 << bits) - 1, 0b10101010 & ((1 << bits) - 1)] * 3
    high = [v | (0x7F << bits) for v in low]  # still fits in 16 bits
    assert bytes(pack(torch.tensor(high).to(dtype), bits).tolist()) == _reference_pack(low, bits)


def test_packed_bytes_never_alias_the_codes() -> None:
    codes = torch.tensor([1, 2, 3], dtype=torch.uint8)
    packed = pack(codes, 8)
    codes[0] = 9
    assert packed.tolist() == [1, 2, 3]


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="bits"):
        pack(torch.zeros(3, dtype=torch.uint8), 9)
    with pytest.raises(ValueError, match="bits"):
        unpack(torch.zeros(3, dtype=torch.uint8), 0, 3)
    with pytest.raises(TypeError, match=r"pack: expected integer codes, got torch\.float32"):
        pack(torch.zeros(3), 4)
    with pytest.raises(ValueError, match="expected 2 uint8 bytes"):
        unpack(torch.zeros(3, dtype=torch.uint8), 4, 4)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 8).flatmap(lambda b: st.tuples(st.just(b), st.lists(st.integers(0, 2**b - 1))))
)
def test_round_trip_property(case: tuple[int, list[int]]) -> None:
    bits, values = case
    codes = torch.tensor(values, dtype=torch.int64)
    packed = pack(codes, bits)
    assert bytes(packed.tolist()) == _reference_pack(values, bits)
    assert unpack(packed, bits, len(values)).tolist() == values


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("bits", WIDTHS)
def test_cuda_matches_cpu(bits: int) -> None:
    codes = _codes(4097, bits)
    packed = pack(codes.cuda(), bits)
    assert packed.is_cuda
    assert torch.equal(packed.cpu(), pack(codes, bits))
    assert torch.equal(unpack(packed, bits, 4097).cpu().to(torch.int64), codes)
