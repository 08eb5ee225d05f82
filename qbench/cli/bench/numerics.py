"""``qbench bench numerics``: the error each format adds to the averaged gradient at K
simulated ranks (qbench.bench.numerics, summarised by qbench.report.numerics)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from qbench.catalog import specs as spec_syntax
from qbench.cli import options
from qbench.cli.tools import ListCommand
from qbench.errors import UserError
from qbench.records.store import atomic_write_json
from qbench.report import numerics as report_numerics
from qbench.report.plots import numerics as plots_numerics

if TYPE_CHECKING:
    from qbench.bench.numerics.gradients import GradientSource


@click.command(cls=ListCommand)
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
@options.setting("--numel", type=int, default=4096,
                 help="Keep the first N values of each gradient (0: all).")  # fmt: skip
@options.setting("--batch-size", type=click.IntRange(min=1), default=32,
                 help="Mini-batch of each rank (--model).")  # fmt: skip
@options.specs("--compressor", "specs", "NAME[:KEY=VALUE,...], e.g. qsgd:bits=8 (repeatable) "
               "[none, fp16, bf16, qsgd:bits=8, and the FP8, MX and NVFP4 formats that are "
               "registered].")  # fmt: skip
@options.listed("--ranks", type=int, help="Simulated ranks K, 2..1024, e.g. --ranks 2 16 256 "
                "[2 4 8 ... 1024].")  # fmt: skip
@options.listed(
    "--order", "orders", metavar="NAME",
    help="Reduction orders: ring, tree, allgather, alltoall, integer (repeatable) [all]; each "
    "rounds only what a rank sends (and the final copy all ranks share); the output ends with "
    "what each order rounds when.",
)  # fmt: skip
@options.repeats("Samples per point, each with fresh per-rank batches and another codec seed.")
@options.setting("--max-calls", type=int, default=4096, help="Most encode calls one sample may "
                 "make: formats that scale per call or per tensor need about K^2 in ring and "
                 "alltoall; larger K say n/a.")  # fmt: skip
@options.threads("torch intra-op threads.")
@options.json_file("Also write every raw sample, the summary and provenance to this JSON file.")
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
    # torch: loaded when the command runs, so that its --help stays fast
    from qbench.bench import numerics as bench_numerics
    from qbench.bench.render import err, out

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
    from qbench.bench.numerics import (
        gradients,  # torch: loaded when the command runs, so that its --help stays fast
    )
    from qbench.run.gradients import ModelGradients

    if path is not None:
        if model is not None:
            raise UserError("give --model or --gradients, not both; e.g. `--gradients g.pt`")
        return gradients.load(Path(path), numel)
    spec = spec_syntax.parse_cli(model or "mlp")
    params = {k: v for k, v in spec.items() if k != "name"}
    return ModelGradients(spec["name"], params, numel=numel, batch_size=batch_size)
