"""The random draws a compressor uses, by the fastest path that gives the same bits: the C fill
(``qbench.compress.kernels.native``, checked bit for bit against ``rng.uniform_reference`` when it
loads) on CPU tensors, else the torch definition in ``qbench.compress.kernels.rng``. Apart from rng
so that the definition imports no kernel path (native checks its C twin against it).
"""

from __future__ import annotations

import torch

from qbench.compress.base import Key
from qbench.compress.kernels import native
from qbench.compress.kernels.rng import MASK32, key_hash, uniform_reference


def uniform(key: Key, offset: int, numel: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 draws in [0, 1) for element indices offset .. offset+numel-1.

    On CPU the compiled twin fills the buffer about 50x faster; elsewhere the torch reference
    runs."""
    if torch.device(device).type == "cpu":
        fill = native.uniform_fill()
        if fill is not None:
            out = torch.empty(numel, dtype=torch.float32)
            fill(key_hash(key), offset & MASK32, numel, out.data_ptr())
            return out
    return uniform_reference(key, offset, numel, device)
