"""How noisy a quantizer is: E ||Q(x) - x||^2 / ||x||^2 over random vectors, each compressor
as qbench builds it (its own keyed random draws, a fresh step per trial).

    .venv/bin/python benchmarks/quantizer_variance.py
    .venv/bin/python benchmarks/quantizer_variance.py --numel 65536 --trials 20 \
        --dist gaussian laplace cubed 'qsgd:bits=2,bucket_size=128,layout=sign'

Prints one line per compressor and distribution: its label, the relative variance (mean over
trials and its standard error) and the bits per value it sends. ``gaussian`` is N(0, 1);
``laplace`` Laplace(0, 1); ``cubed`` a Gaussian cubed, heavy-tailed as gradients are (a few
large values, most near zero), where a bucket's max scale leaves most values far below it.
The defaults are seed 002's 2-bit quantizer (levels -1, 0, 1 with bucket 128, `layout: sign`)
next to the intervals layout with bucket 512 that seed002-cnn-qsgd used before
(docs/results/accuracy.md).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from qbench import compress

DEFAULTS = ("qsgd:bits=2,bucket_size=128,layout=sign", "qsgd:bits=2,bucket_size=512")


DISTS = {
    "gaussian": lambda n, g: torch.randn(n, generator=g),
    "laplace": lambda n, g: (
        -torch.log(torch.rand(n, generator=g)) * torch.randn(n, generator=g).sign()
    ),
    "cubed": lambda n, g: torch.randn(n, generator=g) ** 3,
}


def relative_variance(
    spec: str, dist: str, numel: int, trials: int
) -> tuple[str, list[float], float]:
    """The compressor's label, ||Q(x) - x||^2 / ||x||^2 per trial, and its bits per value."""
    codec = compress.from_spec(spec)
    gen = torch.Generator().manual_seed(0)
    out, bits = [], 0.0
    for step in range(trials):
        x = DISTS[dist](numel, gen)
        payload = codec.encode(x, step=step)
        err = codec.decode(payload) - x
        out.append(float(err.dot(err) / x.dot(x)))
        bits = 8 * payload.nbytes / numel
    return codec.label, out, bits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="*", default=list(DEFAULTS), help="compressor specs")
    ap.add_argument("--numel", type=int, default=65536, help="values per vector [65536]")
    ap.add_argument("--trials", type=int, default=20, help="vectors per compressor [20]")
    ap.add_argument("--dist", nargs="+", choices=sorted(DISTS), default=["gaussian", "cubed"],
                    help="distributions of the values [gaussian cubed]")  # fmt: skip
    args = ap.parse_args()
    for dist in args.dist:
        for spec in args.specs:
            label, v, bits = relative_variance(spec, dist, args.numel, args.trials)
            sem = statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else float("nan")
            print(f"{label:20s} {dist:8s} E|Q(x)-x|^2/|x|^2 = {statistics.mean(v):.3f} "
                  f"+- {sem:.3f} (mean +- s.e. over {len(v)} vectors of {args.numel}), "
                  f"{bits:.2f} bits/value")  # fmt: skip


if __name__ == "__main__":
    main()
