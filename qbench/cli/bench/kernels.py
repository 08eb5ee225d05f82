"""``qbench bench kernels``: encode/decode time of each compressor and the codec roofline
(qbench.bench.kernels, printed by qbench.bench.render)."""

from __future__ import annotations

from pathlib import Path

import click

from qbench.cli import options
from qbench.cli.tools import ListCommand


@click.command(cls=ListCommand)
@options.specs("--compressor", "specs", "NAME[:KEY=VALUE,...], e.g. qsgd:bits=4,bucket_size=512 "
               "(repeatable) [the default families that are registered].")  # fmt: skip
@click.option(
    "--sizes", multiple=True, default=(16, 20, 24), show_default=True,
    type=int,  # the range is checked (and explained) by qbench.bench.kernels
    help="log2 of the element counts, e.g. --sizes 16 20 24 26.",
)  # fmt: skip
@options.repeats("Timed calls per op (median reported), after one warm-up.",
                 type=click.IntRange(min=1))  # fmt: skip
@options.setting(
    "--max-time", type=float, default=5.0,  # checked (and explained) by qbench.bench.kernels
    help="Seconds of timed calls per compressor and size; a slower one stops early with fewer "
    "repeats (the table marks it).",
)  # fmt: skip
@options.setting("--device", type=click.Choice(["cpu", "cuda"]), default="cpu")
@options.threads("torch intra-op threads (1 = like one CPU rank).")
@options.setting(
    "--backend", type=click.Choice(["auto", "torch", "native"]), default="auto",
    help="Compressor code path: compiled kernels when built (auto), the torch reference, or "
    "compiled only (native).",
)  # fmt: skip
@options.setting(
    "--overlap", type=float, default=0.5,  # checked (and explained) by qbench.spec.roofline
    help="Fraction F of the codec time hidden behind other work (backward, other buckets' "
    "transfers), 0 <= F < 1, for the second break-even column: B* / (1 - F).",
)  # fmt: skip
@options.json_file("Also write the rows, the roofline and provenance to this JSON file.")
def kernels(
    specs: tuple[str, ...], sizes: tuple[int, ...], repeats: int, max_time: float, device: str,
    threads: int, backend: str, overlap: float, json_path: str | None,
) -> None:  # fmt: skip
    """Encode/decode time of each compressor against a plain copy of the same tensor, and the
    codec roofline.

    GB/s is fp32 input (4 bytes a value) per second; x copy is time / the time of copy_ of the
    same tensor; x floor is time / the time the bytes the op must move (encode: gradient in,
    payload out, the residual in and out with error feedback; decode: payload in, values out)
    take at that copy's bandwidth, 1.0 at the memory floor.

    Break-even link rate B* (Gbit/s, per compressor and size): below this link rate, compressing
    pays even when nothing hides the codec. Sending n fp32 values raw takes 4n / B; compressed
    4n / (rB) plus the codec time, so it pays while B < B* = (1 - 1/r) / (1/C_enc + 1/C_dec),
    with C the encode and decode throughputs (bytes of input per second) and r = 4n / wire bytes.
    With a fraction F of the codec time hidden (--overlap), B* grows by 1 / (1 - F); "never":
    r <= 1.
    """
    from qbench.bench import (
        render,  # torch: loaded when the command runs, so that its --help stays fast
    )

    render.command(
        specs, sizes=sizes, repeats=repeats, max_time=max_time, device=device, threads=threads,
        backend=backend, overlap=overlap, json_path=Path(json_path) if json_path else None,
    )  # fmt: skip
