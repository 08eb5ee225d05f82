"""Wire layouts: the buffers each built-in compressor's payload is made of, and their sizes
(no torch). ``qbench.catalog.compressors`` names one of these per entry; the codecs
(``qbench.compress``) and kernels build their payloads to them, and
tests/catalog/test_catalog.py checks payload sizes against them.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

Params = dict[str, Any]
WireBuffer = tuple[str, str, int]
"""(buffer name, dtype name as torch spells it, element count), in wire order."""

DTYPE_BYTES = {"uint8": 1, "int16": 2, "int32": 4, "float16": 2, "bfloat16": 2, "float32": 4}


def num_buckets(numel: int, bucket_size: int) -> int:
    return -(-numel // bucket_size)


def packed_nbytes(numel: int, bits: int) -> int:
    """Bytes of numel codes of ``bits`` bits packed end to end."""
    return (numel * bits + 7) // 8


def qsgd_levels_nbytes(numel: int, bits: int) -> int:
    """QSGD codes: bit-packed, or 2 little-endian bytes each at 16 bits."""
    return 2 * numel if bits == 16 else packed_nbytes(numel, bits)


def topk_k(ratio: float, numel: int) -> int:
    """Entries top-k keeps out of numel: ceil(ratio n), at least 1. The decimal the user wrote
    (0.07, not 0.07000000000000000666) decides: ceil(0.07 * 100) = 7."""
    if numel == 0:
        return 0
    return max(1, math.ceil(Fraction(repr(float(ratio))) * numel))


# -- wire layouts (functions, not lambdas in the entries, so that mutation testing reaches them) --
def qsgd_wire(p: Params, n: int) -> list[WireBuffer]:
    """QSGD: the codes (bit-packed, or 2 bytes each at 16 bits), then one fp32 scale per bucket."""
    return [
        ("levels", "uint8", qsgd_levels_nbytes(n, p["bits"])),
        ("scales", "float32", num_buckets(n, p["bucket_size"])),
    ]


def onebit_wire(p: Params, n: int) -> list[WireBuffer]:
    """1bitSGD: one sign bit per value, then the (avg+, avg-) pair of each bucket."""
    return [
        ("signs", "uint8", packed_nbytes(n, 1)),
        ("means", "float32", 2 * num_buckets(n, p["bucket_size"])),
    ]


def fixed_levels(n: int, bits: int) -> WireBuffer:
    if bits == 16:
        return ("levels", "int16", n)
    return ("levels", "uint8", packed_nbytes(n, bits))  # 9..15 bits: planar, same total


def fixed_wire(p: Params, n: int) -> list[WireBuffer]:
    """Fixed point: the codes, then the grid's exponent when delta is ``auto``."""
    exponent: list[WireBuffer] = [("exponent", "int16", 1)] if p["delta"] == "auto" else []
    return [fixed_levels(n, p["bits"]), *exponent]


def topk_wire(p: Params, n: int) -> list[WireBuffer]:
    """Top-k: the k kept values, then their int32 indices."""
    k = topk_k(p["ratio"], n)
    return [("values", "float32", k), ("indices", "int32", k)]


# Element formats by name: (bits, exponent bits, mantissa bits, the smallest positive value as
# a power of two, the largest value). The bit-level definitions (and the tables codecs use) are
# qbench.compress.minifloat's; these are the numbers the planner needs without torch.
ELEMENTS = {
    "e4m3": (8, 4, 3, -9, 448.0), "e5m2": (8, 5, 2, -16, 57344.0),
    "e3m2": (6, 3, 2, -4, 28.0), "e2m3": (6, 2, 3, -3, 7.5), "e2m1": (4, 2, 1, -1, 6.0),
}  # fmt: skip
MX_BLOCK = 32  # OCP MX v1.0: k = 32 elements share one scale
NVFP4_BLOCK = 16


def integer_units(element: str) -> int | None:
    """The largest element value in units of the format's smallest positive value: every value
    of the format is an integer number of those units, so values on one shared scale sum exactly
    as integers. None when it needs more than 31 bits with room for 2 ranks (E5M2)."""
    _, _, _, low, top = ELEMENTS[element]
    units = int(top * 2.0**-low)
    return units if 2 * units < 2**31 else None


def fp8_wire(p: Params, n: int) -> list[WireBuffer]:
    """FP8: one code byte per value, then the float32 scale of each block (block_size 0: one
    for all n values, none for none)."""
    return [
        ("codes", "uint8", n),
        ("scales", "float32", num_buckets(n, p["block_size"] or max(n, 1))),
    ]


def mx_wire(p: Params, n: int) -> list[WireBuffer]:
    """MX: the element codes bit-packed (8, 6 or 4 bits), then one E8M0 byte per 32 values."""
    bits = ELEMENTS[p["element"]][0]
    return [
        ("codes", "uint8", packed_nbytes(n, bits)),
        ("scales", "uint8", num_buckets(n, MX_BLOCK)),
    ]


def nvfp4_wire(p: Params, n: int) -> list[WireBuffer]:
    """NVFP4: 4-bit codes, one E4M3 byte per 16 values, then the float32 tensor scale."""
    return [
        ("codes", "uint8", packed_nbytes(n, 4)),
        ("scales", "uint8", num_buckets(n, NVFP4_BLOCK)),
        ("tensor_scale", "float32", 1),
    ]
