"""``qbench bench comm``: a size sweep of gradient aggregation across ranks (qbench.bench.comm,
printed by qbench.bench.comm.render)."""

from __future__ import annotations

from pathlib import Path

import click

from qbench.bench import comm as bench_comm
from qbench.cli import options
from qbench.cli.tools import ListCommand


@click.command(cls=ListCommand)
@options.listed("--backend", "backends", type=click.Choice(["gloo", "mpi", "nccl"]),
                help="Backends, e.g. --backend gloo mpi [gloo].")  # fmt: skip
@options.world_sizes("Ranks per launch, e.g. --world-size 2 4 [2].")
@options.specs("--scheme", "schemes", "NAME[:KEY=VALUE,...], e.g. reduce-broadcast:overlap=4 "
               "[every registered scheme with a mean result; fp32 allreduce is always added as "
               "the baseline].")  # fmt: skip
@options.specs("--compressor", "compressors", "NAME[:KEY=VALUE,...], e.g. "
               "qsgd:bits=4,bucket_size=512 [none, fp16, qsgd 4-bit b512].")  # fmt: skip
@options.setting("--min-bytes", default="8", help="Smallest fp32 gradient.")
@options.setting("--max-bytes", default="64M",
                 help="Largest fp32 gradient (always measured), e.g. 256M.")  # fmt: skip
@options.setting("--step-factor", type=int, default=4, help="Size multiplier per step.")
@options.repeats("Timed calls per size (median of the max over ranks).")
@options.setting("--warmup", type=int, default=2, help="Untimed calls first.")
@click.option(
    "--bandwidth", metavar="RATE",
    help="Emulate links of this rate, one network namespace per rank (root), e.g. 1gbit.",
)  # fmt: skip
@options.setting(
    "--sync", type=click.Choice(["barrier", "stream"]), default="barrier",
    help="barrier: before every timed call; stream: calls back to back as in a training loop "
    "(with --gap-ms: what ranks sharing cores see).",
)  # fmt: skip
@options.setting("--gap-ms", type=float, default=0.0, help="Busy milliseconds before every "
                 "call, like a training step's compute (the link idles; an emulated link's token "
                 "bucket refills), e.g. --sync stream --gap-ms 10.")  # fmt: skip
@options.json_file("Also write the rows, speedups and provenance to this JSON file.")
def comm(
    backends: tuple[str, ...], world_sizes: tuple[int, ...], schemes: tuple[str, ...],
    compressors: tuple[str, ...], min_bytes: str, max_bytes: str, step_factor: int,
    repeats: int, warmup: int, bandwidth: str | None, sync: str, gap_ms: float,
    json_path: str | None,
) -> None:  # fmt: skip
    """nccl-tests style size sweep of gradient aggregation: time, algbw/busbw, wire bytes,
    relative error, speedup over fp32 allreduce."""
    s = bench_comm.settings(
        backends=backends, world_sizes=world_sizes, schemes=schemes, compressors=compressors,
        min_bytes=min_bytes, max_bytes=max_bytes, step_factor=step_factor, repeats=repeats,
        warmup=warmup, bandwidth=bandwidth, sync=sync, gap_ms=gap_ms,
    )  # fmt: skip
    from qbench.bench.comm import (
        render,  # torch: loaded when the command runs, so that its --help stays fast
    )

    render.command(s, Path(json_path) if json_path else None)
