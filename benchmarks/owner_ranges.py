"""One choice per reduce-broadcast owner range against one per tensor, on a real gradient.

Reduce-broadcast with K ranks cuts a layer group into K owner ranges and encodes each range
(qbench.aggregate.reduce_broadcast). A compressor that picks one width, scale or budget per call
(``scope: global``) then chooses once for the tail of one layer and the head of the next;
``scope: layer`` encodes each tensor part of the range on its own. This prints, per tensor, the
bits per value and the relative error ||Q(g) - g|| / ||g|| of both, averaged over STEPS keys,
for the gradient of one training batch of the model at initialisation (seed 0).

    .venv/bin/python benchmarks/owner_ranges.py [MODEL] [DATASET] [RANKS] [COMPRESSOR...]
    .venv/bin/python benchmarks/owner_ranges.py mlp fashion-mnist 4 adaptive fixedpoint
"""

from __future__ import annotations

import itertools
import sys

import torch

from qbench import models
from qbench.aggregate.base import cut, split_ranges
from qbench.catalog import specs
from qbench.compress import Compressor, from_spec
from qbench.data import real
from qbench.spec import layers

STEPS = 8


def gradient(model_name: str, dataset: str, batch: int = 64) -> dict[str, torch.Tensor]:
    """Each parameter's gradient (flat) for one batch, in the model's order."""
    torch.manual_seed(0)
    model = models.build(model_name)
    data = real.load(dataset)
    x = real.conform(data.train.x[:batch], models.info(model_name).input_shape)
    torch.nn.functional.cross_entropy(model(x), data.train.y[:batch]).backward()
    return {n: p.grad.reshape(-1) for n, p in model.named_parameters() if p.grad is not None}


def main(model_name: str, dataset: str, ranks: int, compressors: list[str]) -> None:
    grads = gradient(model_name, dataset)
    sizes = {n: g.numel() for n, g in grads.items()}
    for raw in compressors:
        spec = specs.parse_cli(raw)
        groups = layers.plan(list(sizes.items()), spec, layers.LayerPolicy())
        print(f"\n{raw}, {ranks} owner ranges per group\n")
        print("| tensor | values | scope | bits/value | rel. error |")
        print("|---|---|---|---|---|")
        for g in groups:
            if g.compressor["name"] == "none":
                continue
            x = torch.cat([grads[n] for n in g.names])
            for scope in ("global", "layer"):
                c = from_spec({**g.compressor, "scope": scope})
                bits, err = _per_tensor(c, x, g.sizes, ranks)
                for name, n, b, e in zip(g.names, g.sizes, bits, err, strict=True):
                    print(f"| {name} | {n} | {scope} | {b:.2f} | {e:.3g} |")


def _per_tensor(
    c: Compressor, x: torch.Tensor, tensors: tuple[int, ...], ranks: int
) -> tuple[list[float], list[float]]:
    """Bits per value and relative error of each tensor, every owner range encoded once."""
    decoded = torch.zeros(len(tensors), STEPS)
    nbytes = torch.zeros(len(tensors))
    bounds = torch.tensor([0, *tensors]).cumsum(0).tolist()
    for step in range(STEPS):
        c.reset()  # one step's encode each time: error feedback starts from nothing
        out = torch.zeros_like(x)
        for a, b in split_ranges(x.numel(), ranks, int(getattr(c, "bucket_size", 1))):
            pieces = cut(tensors, a, b)
            payload = c.encode(x[a:b], step=step, offset=a, name=f"r{a}", pieces=pieces)
            out[a:b] = c.decode(payload)
            if payload.parts:  # per tensor: each part's bytes, headers included, to its tensor
                pos = a
                for part in payload.parts:
                    i = max(j for j, s in enumerate(bounds[:-1]) if s <= pos)
                    nbytes[i] += part.nbytes / STEPS
                    pos += part.numel
                continue
            # one payload for the range: its bytes shared out by element count
            for i, (s, e) in enumerate(itertools.pairwise(bounds)):
                overlap = max(0, min(e, b) - max(s, a))
                nbytes[i] += payload.nbytes * overlap / (b - a) / STEPS
        for i, (s, e) in enumerate(itertools.pairwise(bounds)):
            decoded[i, step] = float((out[s:e] - x[s:e]).norm() / x[s:e].norm())
    bits = [float(nbytes[i]) * 8 / n for i, n in enumerate(tensors)]
    return bits, decoded.mean(1).tolist()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0] if args else "mlp",
        args[1] if len(args) > 1 else "fashion-mnist",
        int(args[2]) if len(args) > 2 else 4,
        args[3:] or ["adaptive", "fixedpoint"],
    )
