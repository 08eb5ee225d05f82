"""Bucket and wire-size helpers shared by the bucketed compressors and their kernels (private).

``tree_sum`` fixes the order of every bucket sum (QSGD's l2 norm, 1bitSGD's means) so that the
torch reference, the C loops and the CUDA kernels round identically: the row is padded with +0.0
to the next power of two w, then halves are added, ``row[:h] + row[h:2h]`` for h = w/2, ..., 1.
``kernels/qsgd_math.h`` describes the same tree; torch's own ``sum`` has no fixed order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qbench.catalog.wire import num_buckets  # noqa: F401  # the wire's one definition
from qbench.catalog.wire import qsgd_levels_nbytes as levels_nbytes  # noqa: F401


def buckets(x: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """View as (buckets, bucket_size), zero-padding the last bucket (zeros change no scale)."""
    pad = -x.numel() % bucket_size
    if pad:
        x = torch.cat([x, x.new_zeros(pad)])
    return x.reshape(-1, bucket_size)


def tree_width(n: int) -> int:
    """The power of two a row of n values is padded to before summing."""
    return 1 << max(n - 1, 0).bit_length()


def tree_sum(rows: torch.Tensor) -> torch.Tensor:
    """Sum of each row of a 2-D float tensor, in the fixed pairwise order described above."""
    width = tree_width(rows.shape[1])
    if width != rows.shape[1]:
        rows = F.pad(rows, (0, width - rows.shape[1]))  # +0.0, as the kernels pad
    while rows.shape[1] > 1:
        half = rows.shape[1] // 2
        rows = rows[:, :half] + rows[:, half:]
    return rows[:, 0]
