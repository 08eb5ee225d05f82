"""C(t) as one rank encodes it, for the single-process references of the decentralized schemes
(tests/aggregate/test_gossip.py, tests/aggregate/test_push_sum.py): decode(encode(.)) with that
rank's own key (qbench.compress.base.Key: the step, the rank, the scheme's stream and the global
index where each slice starts), slice by slice, so that a bug making every rank draw the same
numbers fails.
"""

from __future__ import annotations

from typing import Any

import torch

from qbench.compress import from_spec

Parts = list[tuple[slice, int]]
"""Slices of the model, each mixed by its own scheme instance, with that instance's offset."""


def rank_codec(
    comp: dict[str, Any], t: torch.Tensor, step: int, rank: int, parts: Parts, stream: int
) -> torch.Tensor:
    """decode(encode(t)) as rank ``rank`` does it at ``step`` on ``stream``, slice by slice."""
    out = torch.empty_like(t)
    for part, offset in parts:
        c = from_spec(comp)
        payload = c.encode(t[part].float(), step=step, rank=rank, stream=stream, offset=offset)
        out[part] = c.decode(payload).double()
    return out
