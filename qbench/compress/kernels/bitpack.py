"""Pack small unsigned codes (1..8 bits each) densely into bytes, and back.

Layout: little-endian bit order; value i occupies bits [i*b, (i+1)*b) of the byte stream, so
n values take exactly ceil(n*b/8) bytes (trailing bytes made only of padding are never kept).
Everything is vectorised torch on the codes' own device: no per-element Python loop.
"""

from __future__ import annotations

import torch

from qbench.catalog import wire

_BYTE_ALIGNED = (1, 2, 4)  # widths that divide 8: values never straddle a byte


packed_nbytes = wire.packed_nbytes
"""Bytes that ``pack`` returns for ``numel`` codes of ``bits`` bits (the catalog's formula)."""


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes (only their low ``bits`` bits are kept) into a flat uint8 tensor."""
    _check_bits(bits)
    if codes.is_floating_point() or codes.is_complex():
        raise TypeError(f"pack: expected integer codes, got {codes.dtype}")
    flat = codes.reshape(-1)
    if bits == 8:
        return flat.to(torch.uint8, copy=True)
    if bits in _BYTE_ALIGNED:
        return _pack_byte_aligned(flat.to(torch.uint8) & ((1 << bits) - 1), bits)
    return _pack_words(flat.to(torch.int64) & ((1 << bits) - 1), bits, flat.numel())


def unpack(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of ``pack``: the first ``numel`` codes as uint8."""
    _check_bits(bits)
    expected = packed_nbytes(numel, bits)
    if packed.dtype != torch.uint8 or packed.numel() != expected:
        raise ValueError(
            f"unpack: expected {expected} uint8 bytes for {numel} x {bits}-bit codes, "
            f"got {packed.numel()} {packed.dtype}"
        )
    flat = packed.reshape(-1)
    if bits == 8:
        return flat
    if bits in _BYTE_ALIGNED:
        return _unpack_byte_aligned(flat, bits, numel)
    return _unpack_words(flat, bits, numel)


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"bitpack: bits must be 1..8, got {bits}")


def _pad_to_multiple(x: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = -x.numel() % multiple
    return torch.cat([x, x.new_zeros(pad)]) if pad else x


def _pack_byte_aligned(codes: torch.Tensor, bits: int) -> torch.Tensor:
    # 8/bits codes per byte, shifted into disjoint fields: their uint8 sum is their OR.
    per_byte = 8 // bits
    lanes = _pad_to_multiple(codes, per_byte).view(-1, per_byte)
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=codes.device)
    return (lanes << shifts).sum(dim=1, dtype=torch.uint8)


def _unpack_byte_aligned(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    codes = (packed.unsqueeze(1) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:numel]


def _pack_words(codes: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    # 8 codes of `bits` bits fill exactly `bits` bytes: build one int64 word per group of 8
    # (fields are disjoint, so summing equals OR-ing), then split each word into its bytes.
    groups = _pad_to_multiple(codes, 8).view(-1, 8)
    field_shifts = torch.arange(0, 8 * bits, bits, dtype=torch.int64, device=codes.device)
    words = (groups << field_shifts).sum(dim=1)
    byte_shifts = torch.arange(0, 8 * bits, 8, dtype=torch.int64, device=codes.device)
    stream = ((words.unsqueeze(1) >> byte_shifts) & 0xFF).to(torch.uint8).reshape(-1)
    return stream[: packed_nbytes(numel, bits)]


def _unpack_words(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    rows = _pad_to_multiple(packed, bits).view(-1, bits).to(torch.int64)
    byte_shifts = torch.arange(0, 8 * bits, 8, dtype=torch.int64, device=packed.device)
    words = (rows << byte_shifts).sum(dim=1)
    field_shifts = torch.arange(0, 8 * bits, bits, dtype=torch.int64, device=packed.device)
    codes = (words.unsqueeze(1) >> field_shifts) & ((1 << bits) - 1)
    return codes.to(torch.uint8).reshape(-1)[:numel]
