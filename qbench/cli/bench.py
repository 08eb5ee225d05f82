"""``qbench bench kernels | comm | numerics``: micro-benchmarks apart from sweeps (qbench.bench)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from qbench.cli.tools import ListCommand

if TYPE_CHECKING:
    from qbench.bench.numerics_gradients import GradientSource


@click.group()
def bench() -> None:
    """Micro-benchmarks of single pieces (compression kernels, ...), apart from sweeps."""


@bench.command(cls=ListCommand)
@click.option(
    "--compressor",
    "specs",
    multiple=True,
    metavar="SPEC",
    help="NAME[:KEY=VALUE,...], e.g. qsgd:bits=4,bucket_size=512 (repeatable) [the default "
    "families that are registered].",
)
@click.option(
    "--sizes",
    multiple=True,
    type=int,  # the range is checked (and explained) by qbench.bench.kernels
    default=(16, 20, 24),
    show_default=True,
    help="log2 of the element counts, e.g. --sizes 16 20 24 26.",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Timed calls per op (median reported), after one warm-up.",
)
@click.option(
    "--max-time",
    type=float,  # checked (and explained) by qbench.bench.kernels
    default=5.0,
    show_default=True,
    help="Seconds of timed calls per compressor and size; a slower one stops early with fewer "
    "repeats (the table marks it).",
)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="torch intra-op threads (1 = like one CPU rank).",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "torch", "native"]),
    default="auto",
    show_default=True,
    help="Compressor code path: compiled kernels when built (auto), the torch reference, or "
    "compiled only (native).",
)
@click.option(
    "--overlap",
    type=float,  # checked (and explained) by qbench.spec.roofline
    default=0.5,
    show_default=True,
    help="Fraction F of the codec time hidden behind other work (backward, other buckets' "
    "transfers), 0 <= F < 1, for the second break-even column: B* / (1 - F).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    help="Also write the rows, the roofline and provenance to this JSON file.",
)
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
    from qbench.bench import render

    render.command(
        specs, sizes=sizes, repeats=repeats, max_time=max_time, device=device, threads=threads,
        backend=backend, overlap=overlap, json_path=Path(json_path) if json_path else None,
    )  # fmt: skip


@bench.command(cls=ListCommand)
@click.option(
    "--backend", "backends", multiple=True, type=click.Choice(["gloo", "mpi", "nccl"]),
    help="Backends, e.g. --backend gloo mpi [gloo].",
)  # fmt: skip
@click.option(
    "--world-size", "world_sizes", multiple=True, type=int,
    help="Ranks per launch, e.g. --world-size 2 4 [2].",
)  # fmt: skip
@click.option(
    "--scheme", "schemes", multiple=True, metavar="SPEC",
    help="NAME[:KEY=VALUE,...], e.g. reduce-broadcast:overlap=4 [every registered scheme "
    "with a mean result; fp32 allreduce is always added as the baseline].",
)  # fmt: skip
@click.option(
    "--compressor", "compressors", multiple=True, metavar="SPEC",
    help="NAME[:KEY=VALUE,...], e.g. qsgd:bits=4,bucket_size=512 [none, fp16, qsgd 4-bit b512].",
)  # fmt: skip
@click.option("--min-bytes", default="8", show_default=True, help="Smallest fp32 gradient.")
@click.option(
    "--max-bytes", default="64M", show_default=True,
    help="Largest fp32 gradient (always measured), e.g. 256M.",
)  # fmt: skip
@click.option(
    "--step-factor", type=int, default=4, show_default=True, help="Size multiplier per step."
)
@click.option(
    "--repeats", type=int, default=5, show_default=True,
    help="Timed calls per size (median of the max over ranks).",
)  # fmt: skip
@click.option("--warmup", type=int, default=2, show_default=True, help="Untimed calls first.")
@click.option(
    "--bandwidth", metavar="RATE",
    help="Emulate links of this rate, one network namespace per rank (root), e.g. 1gbit.",
)  # fmt: skip
@click.option(
    "--sync", type=click.Choice(["barrier", "stream"]), default="barrier", show_default=True,
    help="barrier: before every timed call; stream: calls back to back as in a training loop "
    "(with --gap-ms: what ranks sharing cores see).",
)  # fmt: skip
@click.option(
    "--gap-ms", type=float, default=0.0, show_default=True,
    help="Busy milliseconds before every call, like a training step's compute (the link idles; "
    "an emulated link's token bucket refills), e.g. --sync stream --gap-ms 10.",
)  # fmt: skip
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False),
    help="Also write the rows, speedups and provenance to this JSON file.",
)  # fmt: skip
def comm(
    backends: tuple[str, ...], world_sizes: tuple[int, ...], schemes: tuple[str, ...],
    compressors: tuple[str, ...], min_bytes: str, max_bytes: str, step_factor: int,
    repeats: int, warmup: int, bandwidth: str | None, sync: str, gap_ms: float,
    json_path: str | None,
) -> None:  # fmt: skip
    """nccl-tests style size sweep of gradient aggregation: time, algbw/busbw, wire bytes,
    relative error, speedup over fp32 allreduce."""
    from qbench.bench import comm as bench_comm
    from qbench.bench import render_comm

    s = bench_comm.settings(
        backends=backends, world_sizes=world_sizes, schemes=schemes, compressors=compressors,
        min_bytes=min_bytes, max_bytes=max_bytes, step_factor=step_factor, repeats=repeats,
        warmup=warmup, bandwidth=bandwidth, sync=sync, gap_ms=gap_ms,
    )  # fmt: skip
    render_comm.command(s, Path(json_path) if json_path else None)


@bench.command(cls=ListCommand)
@click.option(
    "--model", metavar="NAME",
    help="Zoo model whose gradients the ranks hold, NAME[:KEY=VALUE,...] (`qbench models`); "
    "each rank's on its own synthetic mini-batch, same weights [mlp].",
)  # fmt: skip
@click.option(
    "--gradients", "gradients_file", type=click.Path(dir_okay=False),
    help="Instead of --model: a torch.save'd 2-D float tensor [R, n], one row per rank (the "
    "same rows every repeat).",
)  # fmt: skip
@click.option(
    "--numel", type=int, default=4096, show_default=True,
    help="Keep the first N values of each gradient (0: all).",
)  # fmt: skip
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=32, show_default=True,
    help="Mini-batch of each rank (--model).",
)  # fmt: skip
@click.option(
    "--compressor", "specs", multiple=True, metavar="SPEC",
    help="NAME[:KEY=VALUE,...], e.g. qsgd:bits=8 (repeatable) [none, fp16, bf16, qsgd:bits=8, "
    "and the FP8, MX and NVFP4 formats that are registered].",
)  # fmt: skip
@click.option(
    "--ranks", multiple=True, type=int,
    help="Simulated ranks K, 2..1024, e.g. --ranks 2 16 256 [2 4 8 ... 1024].",
)  # fmt: skip
@click.option(
    "--order", "orders", multiple=True, metavar="NAME",
    help="Reduction orders: ring, tree, allgather, alltoall, integer (repeatable) [all]; each "
    "rounds only what a rank sends (and the final copy all ranks share); the output ends with "
    "what each order rounds when.",
)  # fmt: skip
@click.option(
    "--repeats", type=int, default=5, show_default=True,
    help="Samples per point, each with fresh per-rank batches and another codec seed.",
)  # fmt: skip
@click.option(
    "--max-calls", type=int, default=4096, show_default=True,
    help="Most encode calls one sample may make: formats that scale per call or per tensor "
    "need about K^2 in ring and alltoall; larger K say n/a.",
)  # fmt: skip
@click.option(
    "--threads", type=click.IntRange(min=1), default=1, show_default=True,
    help="torch intra-op threads.",
)  # fmt: skip
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False),
    help="Also write every raw sample, the summary and provenance to this JSON file.",
)  # fmt: skip
@click.option(
    "--figure", "figure_path", type=click.Path(dir_okay=False),
    help="Also draw relative error vs K (log-log, a panel per format) to this .png or .pdf.",
)  # fmt: skip
def numerics(
    model: str | None, gradients_file: str | None, numel: int, batch_size: int,
    specs: tuple[str, ...], ranks: tuple[int, ...], orders: tuple[str, ...], repeats: int,
    max_calls: int, threads: int, json_path: str | None, figure_path: str | None,
) -> None:  # fmt: skip
    """How much error each format adds to the averaged gradient, per reduction order, at K
    simulated ranks (one process): relative error against the float64 mean, bias (it includes
    noise / sqrt(repeats): read it against the noise floor beside it), cosine similarity, and
    the growth with K. The defaults (10 formats, K = 2..1024, 5 repeats, 4096 values of mlp
    gradients) take about 2.5 minutes on 2 CPU cores."""
    from qbench.bench import numerics as bench_numerics
    from qbench.bench.render import err, out
    from qbench.records.store import atomic_write_json
    from qbench.report import numerics as report_numerics
    from qbench.report.plots import numerics as plots_numerics

    s = bench_numerics.settings(
        specs=specs, ranks=ranks, orders=orders, repeats=repeats, numel=numel,
        max_calls=max_calls, threads=threads,
    )  # fmt: skip
    figure = plots_numerics.check_path(Path(figure_path)) if figure_path else None
    source = _gradients(model, gradients_file, s.numel, batch_size)
    result = bench_numerics.measure(s, source, lambda what: err.print(what, highlight=False))
    doc = report_numerics.with_summary(bench_numerics.to_document(result))
    report_numerics.show(doc, out, err)
    err.print(f"simulated in {result.seconds:.1f} s", highlight=False)
    if json_path is not None:
        atomic_write_json(Path(json_path), doc)
        err.print(f"wrote {json_path}", highlight=False)
    if figure is not None:
        plots_numerics.write(doc, figure)
        err.print(f"wrote {figure}", highlight=False)


def _gradients(model: str | None, path: str | None, numel: int, batch_size: int) -> GradientSource:
    """The ranks' gradients: a saved tensor or a zoo model's (mlp unless told)."""
    from qbench.bench import numerics_gradients
    from qbench.catalog import specs as spec_syntax
    from qbench.errors import UserError
    from qbench.run.gradients import ModelGradients

    if path is not None:
        if model is not None:
            raise UserError("give --model or --gradients, not both; e.g. `--gradients g.pt`")
        return numerics_gradients.load(Path(path), numel)
    spec = spec_syntax.parse_cli(model or "mlp")
    params = {k: v for k, v in spec.items() if k != "name"}
    return ModelGradients(spec["name"], params, numel=numel, batch_size=batch_size)
