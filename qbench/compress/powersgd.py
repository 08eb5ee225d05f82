"""PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019) as PyTorch ships it: a DDP hook.

The compressor practitioners reach for first, so it is the peer to compare QSGD and 1-bit
against. Per gradient matrix M (n x m, a conv kernel flattened to n x the rest) and rank r, one
step of power iteration: P = M Q (allreduce P, orthogonalize), Q = M^T P (allreduce Q), and the
mean is approximated by P Q^T; (n + m) r values go on the wire instead of n m. 1-D tensors and
matrices that would not shrink ``min_compression_rate`` times are allreduced as they are.

It is not an encode / decode codec: its two allreduces are part of the algorithm. So it runs
only as torch's ``powerSGD_hook`` under ``scheme: ddp`` (``qbench.ddp.torch_hooks``), and the
planner excludes it from every other scheme with that reason. This class holds and validates its
parameters and names it in tables.
"""

from __future__ import annotations

from typing import Any, ClassVar

from qbench.compress.base import Compressor, Key, Payload


class PowerSGD(Compressor):
    name: ClassVar[str] = "powersgd"
    # Parameters (documented and validated in qbench.catalog.compressors). ``start_iter``:
    # torch defaults to 1000 for training from scratch; qbench takes the smallest value torch
    # allows with error feedback or warm start (2), so the measured iterations after warm-up
    # are compressed. Raise it for accuracy runs as the PowerSGD paper advises.
    rank: int
    start_iter: int
    warm_start: bool
    error_feedback: bool
    min_compression_rate: float

    def hook_params(self) -> dict[str, Any]:
        """Keyword arguments of ``qbench.ddp.torch_hooks.powersgd_state``."""
        return {
            "rank": self.rank, "start_iter": self.start_iter, "warm_start": self.warm_start,
            "error_feedback": self.error_feedback,
            "min_compression_rate": float(self.min_compression_rate),
        }  # fmt: skip

    def _encode(self, grad: Any, key: Key, offset: int, name: str) -> Payload:
        raise NotImplementedError("powersgd runs only as torch's DDP hook (scheme ddp)")

    def _decode(self, payload: Payload) -> Any:
        raise NotImplementedError("powersgd runs only as torch's DDP hook (scheme ddp)")
