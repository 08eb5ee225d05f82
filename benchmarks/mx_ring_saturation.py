"""Why an MX ring allreduce is biased at many ranks: the scale's saturation, or re-rounding to
nearest on a coarse grid at every hop? Simulated ranks in one process, as ``qbench bench
numerics`` runs them (the same gradients, seeds and orders), for four variants of one MX codec:

    .venv/bin/python benchmarks/mx_ring_saturation.py                 # MXFP4 ring, K = 256
    .venv/bin/python benchmarks/mx_ring_saturation.py --ranks 16 256 --element e4m3 --order tree

* ``nearest, spec scale``: the codec as specified (OCP MX v1.0 section 6.3): X = 2^(floor(log2
  max|x|) - emax) leaves max|x| / X in [2^emax, 2^(emax+1)), above the largest element value
  (E2M1: 6 of [4, 8)), so a block's largest values saturate, always toward zero;
* ``nearest, fitting scale``: X doubled for the blocks where max|x| / X passes the largest
  value, i.e. 2^ceil(log2(max|x| / largest)): nothing saturates, the rounding is still nearest;
* ``stochastic, spec scale`` and ``stochastic, fitting scale``: the same with stochastic
  rounding (the last one is unbiased: no value saturates and every rounding is unbiased).

The fitting scale is this script's (``FitMX``; qbench's codec keeps the specification's), on the
torch reference (``native.backend("torch")``; the compiled kernels compute the specification's
scale, byte-identical to the reference). Per variant: the median relative error over the repeats
with its 95 % interval, the bias and its noise floor (``qbench.report.numerics``'s definitions),
and the gain est . mean / mean . mean (1: no shrinkage; below 1: the sum lost magnitude).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import asdict

import torch

from qbench.bench import numerics
from qbench.bench.numerics import orders
from qbench.compress import blockscale as bs
from qbench.compress import minifloat as mf
from qbench.compress.kernels import native
from qbench.compress.lowfloat import MX
from qbench.report import numerics as report_numerics
from qbench.run.gradients import ModelGradients

E8M0_TOP = 254  # 2^127, the largest E8M0 scale (255 is NaN)


class FitScaling(bs.Scaling):
    """MX scales that fit the block: the specification's, doubled where max|x| / X would pass
    the element format's largest value."""

    def scales(self, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        codes, _ = super().scales(amax)
        over = amax.double() > mf.e8m0_value(codes) * self.element.max_normal  # exact in fp64
        return torch.where(over & (codes < E8M0_TOP), codes + 1, codes).to(torch.uint8), None


class FitMX(MX):
    @property
    def scaling(self) -> bs.Scaling:
        return FitScaling("mx", mf.FORMATS[self.element], bs.MX_BLOCK)


VARIANTS = {
    "nearest, spec scale": (MX, "nearest"),
    "nearest, fitting scale": (FitMX, "nearest"),
    "stochastic, spec scale": (MX, "stochastic"),
    "stochastic, fitting scale": (FitMX, "stochastic"),
}


def measure(args: argparse.Namespace) -> list[tuple[str, int, report_numerics.Summary, float]]:
    source = ModelGradients("mlp", numel=args.numel, batch_size=32)
    run = orders.ORDERS[args.order]
    assert run is not None, "the integer order has no Rounder"
    found: dict[tuple[str, int], tuple[list[numerics.Sample], torch.Tensor, list[float]]] = {}
    for repeat in range(args.repeats):  # as numerics._simulate: fresh gradients, seed = repeat
        grads = source.gradients(repeat, max(args.ranks))
        for k in args.ranks:
            x = grads[:k]
            mean = x.double().sum(0) / k
            for name, (cls, rounding) in VARIANTS.items():
                comp = cls(seed=repeat, element=args.element, rounding=rounding)
                t0 = time.perf_counter()
                with native.backend("torch"):
                    est = run(orders.Rounder(comp), x)
                sample, err = numerics.sample(est, mean, repeat, time.perf_counter() - t0)
                samples, total, gains = found.setdefault((name, k), ([], 0 * mean, []))
                samples.append(sample)
                total.add_(err)
                gains.append(float(est.double() @ mean) / float(mean @ mean))
    rows = []
    for (name, k), (samples, total, gains) in found.items():
        bias_norm = float(total.norm()) / len(samples)
        row = {"compressor": name, "order": args.order, "ranks": k, "status": "ok",
               "samples": [asdict(s) for s in samples], "bias_norm": bias_norm}  # fmt: skip
        rows.append((name, k, report_numerics.summarize([row])[0], statistics.median(gains)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[256])
    ap.add_argument("--element", default="e2m1", choices=tuple(mf.FORMATS))
    ap.add_argument("--order", default="ring", choices=("ring", "tree", "allgather", "alltoall"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--numel", type=int, default=numerics.DEFAULT_NUMEL)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load, start = os.getloadavg()[0], time.perf_counter()
    rows = measure(args)
    print(f"MX {args.element}, {args.order}, simulated ranks (one process), mlp gradients (first "
          f"{args.numel} values), {args.repeats} repeats; load {load:.2f} -> "
          f"{os.getloadavg()[0]:.2f}, {time.perf_counter() - start:.0f} s")  # fmt: skip
    print("| variant | K | rel. error [95 % interval] | bias | noise floor | gain |")
    print("|---|---|---|---|---|---|")
    for name, k, s, gain in sorted(rows, key=lambda r: (r[1], list(VARIANTS).index(r[0]))):
        print(f"| {name} | {k} | {s.median:.3f} [{s.low:.3f}, {s.high:.3f}] | {s.bias:.3f} | "
              f"{s.noise_floor:.3f} | {gain:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
