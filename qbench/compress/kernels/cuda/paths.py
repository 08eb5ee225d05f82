"""Which kernel a CUDA codec call takes: the one-pass vector kernels (issue 48), or the general
ones for what they do not hold.

The vector kernels load and store 16 bytes at a time, so every tensor they touch must start at a
multiple of 16 bytes; a view may start at any float, and the check is made once per call on the
host. Each also has sizes it holds: QSGD buckets of a multiple of 8 values up to 8192, 1bitSGD
buckets whose tree fits one warp, FP8 / MX / NVFP4 blocks of 8 to 256 values (a power of two)
or one block for the whole tensor. Everything else takes the general kernels, which take any
alignment and size.
"""

from __future__ import annotations

import torch

from qbench.compress.kernels.abi import QsgdFormat
from qbench.compress.kernels.buckets import tree_width


def aligned(to: int, *tensors: torch.Tensor | None) -> bool:
    """Whether every tensor starts at a multiple of ``to`` bytes; None, and an empty tensor
    (passed as a null pointer), pass."""
    return all(t is None or t.data_ptr() % to == 0 for t in tensors)


def qsgd_lanes(fmt: QsgdFormat, *tensors: torch.Tensor) -> int:
    """Threads per bucket of qb_qsgd_encode_vec, 0 where it does not take the encode. It takes
    buckets of a multiple of 8 values (a thread holds a group of 8) up to 8192 (1024 threads, one
    block) and 16-byte aligned tensors (views may start at any float); a bucket's threads are a
    power of two, and at least 8 for the l2 norm (its sum's butterfly, kernels/qsgd.cu)."""
    size = fmt.bucket_size
    if size % 8 or size > 8 * 1024 or not aligned(16, *tensors):
        return 0
    lanes = tree_width(size // 8)
    return max(lanes, 8) if fmt.norm == "l2" else lanes


def lf_encode_shift(block: int, numel: int) -> int | None:
    """qb_lf_encode_vec's shift for blocks of ``block`` values: s with block = 8 << s (a block is
    1 to 32 lanes of one warp), -1 when one block holds all ``numel`` values (its max then comes
    from qb_lf_amax); None: the general path."""
    if block in (8, 16, 32, 64, 128, 256):
        return block.bit_length() - 4
    return -1 if block >= numel else None


def lf_decode_shift(block: int, numel: int) -> int | None:
    """qb_lf_decode_vec's: group g lies in block g >> s; None: the general path."""
    if block >= numel:
        return 62  # one block
    return block.bit_length() - 4 if block >= 8 and block & (block - 1) == 0 else None


def onebit_one_pass(bucket_size: int, *tensors: torch.Tensor | None) -> bool:
    """Whether qb_onebit_encode_fused takes a 1bitSGD encode: buckets of a multiple of 8 values
    (a lane holds 8) whose tree fits one warp, and 16-byte aligned tensors (its float4 loads and
    stores; views may start at any float)."""
    fits = bucket_size % 8 == 0 and tree_width(bucket_size) <= 256
    return fits and aligned(16, *tensors)
