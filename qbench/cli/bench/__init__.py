"""``qbench bench kernels | comm | numerics``: micro-benchmarks apart from sweeps (qbench.bench),
a module per command, imported when that command runs or shows its help."""

from __future__ import annotations

import click

from qbench.cli.tools import Lazy, LazyGroup

COMMANDS = {
    "kernels": Lazy("qbench.cli.bench.kernels:kernels", "Encode/decode time of each compressor "
                    "against a plain copy of the same tensor, and the codec roofline."),
    "comm": Lazy("qbench.cli.bench.comm:comm", "nccl-tests style size sweep of gradient "
                 "aggregation: time, algbw/busbw, wire bytes, relative error, speedup over fp32 "
                 "allreduce."),
    "numerics": Lazy("qbench.cli.bench.numerics:numerics", "How much error each format adds to "
                     "the averaged gradient, per reduction order, at K simulated ranks (one "
                     "process): relative error against the float64 mean, bias (it includes noise "
                     "/ sqrt(repeats): read it against the noise floor beside it), cosine "
                     "similarity, and the growth with K."),
}  # fmt: skip


@click.group(cls=LazyGroup, lazy=COMMANDS)
def bench() -> None:
    """Micro-benchmarks of single pieces (compression kernels, ...), apart from sweeps."""
