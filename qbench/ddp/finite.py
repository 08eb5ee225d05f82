"""A DDP communication hook that never hands a NaN or inf on: each bucket is checked before the
hook it wraps sees it (qbench's run loop wraps every hook it registers, torch's and qbench's).

Under DDP the gradients leave during backward, bucket by bucket, so this is where a rank's own
gradient can be checked before any codec or collective sees it; after backward only the
reduced gradient is left, in which a compressor may have dropped (top-k), replaced (fixed
point) or spread (QSGD, 1bitSGD) the NaN. A bucket with a NaN or inf goes out as zeros: the
collectives of the step still match on every rank, no codec and no error-feedback memory
receives the NaN, and the run loop then fails or skips the step on every rank
(:mod:`qbench.run.nonfinite`), so the zeros are never applied. The hook records the first
tensor that had one; the loop reads it with :meth:`FiniteHookState.take` after backward.

The check is one sum per bucket (``qbench.compress.base.all_finite``) in the thread that runs
the hooks, and on a GPU a wait for the bucket's gradient before it goes out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from qbench.compress.base import all_finite, nonfinite_kind

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


@dataclass
class FiniteHookState:
    """State handed to DDP with :func:`finite_hook`: the wrapped hook and its state, the name of
    each parameter (by ``id``) and what this step's buckets held."""

    inner: Any
    hook: Hook
    names: dict[int, str]
    found: tuple[str, str] | None = None
    """The first tensor of this step found holding a NaN or inf, and which (``NaN``/``inf``)."""

    def take(self) -> tuple[str, str] | None:
        """What this step found (None: every bucket was finite), forgotten for the next step."""
        found, self.found = self.found, None
        return found


def finite_hook(
    state: FiniteHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket, or zeros in its place when it holds a NaN or inf,
    through the wrapped hook."""
    buffer = bucket.buffer()
    if not all_finite(buffer):
        if state.found is None:
            state.found = _first(bucket, state.names)
        buffer.zero_()
    return state.hook(state.inner, bucket)


def _first(bucket: dist.GradBucket, names: dict[int, str]) -> tuple[str, str]:
    """The bucket's first tensor holding a NaN or inf (in the bucket's order) and which."""
    for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
        if not bool(torch.isfinite(g).all()):
            return names.get(id(p), f"a tensor of shape {tuple(p.shape)}"), nonfinite_kind(g)
    return f"bucket {bucket.index()}", nonfinite_kind(bucket.buffer())


# DDP checks a hook's annotations as objects; `from __future__ import annotations` made them
# strings, so give DDP the real ones.
finite_hook.__annotations__.update(
    {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
)
