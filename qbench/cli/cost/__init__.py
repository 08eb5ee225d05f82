"""``qbench cost fit | predict | crossover | validate | utilization``: the cost model on the
command line.

Listed in ``qbench.cli.COMMANDS`` as ``cost``, and under its old name ``qbench model``
(hidden, ``moved``), which says on stderr that it moved. The maths lives in
``qbench.costmodel``; this module parses options, ``qbench.cli.cost.configs`` turns them into
configurations and ``qbench.cli.cost.render`` prints the tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from qbench.cli import options
from qbench.cli.cost.configs import DEFAULT_COMPRESSORS, DEFAULT_SCHEMES, build_configs
from qbench.cli.cost.render import (
    FORMATS,
    err_console,
    held_out_line,
    print_frame,
    show_crossovers,
    show_fit,
    show_needed,
    show_predictions,
    show_utilization,
    show_validation,
)
from qbench.cli.tools import ListCommand
from qbench.costmodel.crossover import check_rate
from qbench.costmodel.crossover import crossover as find_crossover
from qbench.costmodel.fit import fit as fit_model
from qbench.costmodel.inputs import load_input
from qbench.costmodel.model import CostModel
from qbench.costmodel.predict import predict_frame
from qbench.costmodel.schemes import ALLREDUCE, BACKWARD, FLAT, SCHEMES, full_precision
from qbench.costmodel.utilization import IDEAL, FittedTransfer
from qbench.costmodel.utilization import check as check_utilization
from qbench.costmodel.utilization import fit as fit_utilization
from qbench.costmodel.utilization import needed as needed_rates
from qbench.costmodel.validate import validate as validate_paths
from qbench.errors import UserError


@click.group()
def cost() -> None:
    """Cost model: fit alpha-beta, codec, compute and DDP bucket parameters; predict; find the
    crossover with DDP fp32; validate."""


class _Moved(click.Group):
    """The group's old name: works as before, after one line on stderr."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:  # fmt: skip
        click.echo("qbench: `qbench model` moved to `qbench cost` (same commands)", err=True)
        return super().make_context(info_name, args, parent=parent, **extra)


moved = _Moved(
    "model", commands=cost.commands, hidden=True, help="Moved to `qbench cost` (the cost model)."
)


# -- fit -----------------------------------------------------------------------------------------
@cost.command(cls=ListCommand)
@click.argument("dirs", nargs=-1, metavar="[DIR]...")
@options.listed("--comm", "comm_files", metavar="FILE.json", help="`qbench bench comm --json` "
                "output(s): alpha-beta of each collective, codec phases.")  # fmt: skip
@options.listed("--kernels", "kernel_files", metavar="FILE.json", help="`qbench bench kernels "
                "--json` output(s): encode/decode seconds per element.")  # fmt: skip
@options.flag("--comm-from-runs", help="Also fit collectives from the runs' t_comm vs bytes_sent "
              "(approximate: layer groups).")  # fmt: skip
@options.listed(
    "--hold-out", "hold_out", metavar="LABEL=VALUE",
    help="Leave runs with this label value out of the fit (e.g. world_size=4, network=300mbit), "
    "so that `cost validate` scores them as held-out.",
)  # fmt: skip
@options.out_file("Model JSON to write.")
def fit(
    dirs: tuple[str, ...], comm_files: tuple[str, ...], kernel_files: tuple[str, ...],
    comm_from_runs: bool, hold_out: tuple[str, ...], out: str,
) -> None:  # fmt: skip
    """Fit the model from results DIRs (compute, codec) and bench JSON files; write --out."""
    for d in dirs:
        if not Path(d).is_dir():
            raise UserError(f"{d}: not a results directory; bench JSON files go after --comm")
    pairs = []
    for item in hold_out:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise UserError(f"--hold-out {item!r}: expected LABEL=VALUE, e.g. world_size=4")
        pairs.append((key.strip(), value.strip()))
    m = fit_model(
        comm_docs=[(_json(f, "comm"), f) for f in comm_files],
        kernel_docs=[(_json(f, "kernels"), f) for f in kernel_files],
        run_dirs=list(dirs), comm_from_runs=comm_from_runs, hold_out=pairs,
    )  # fmt: skip
    m.save(out)
    show_fit(m)
    err_console().print(f"wrote {out}", highlight=False)


def _json(path: str, kind: str) -> Any:
    got, doc = load_input(path)
    if got != kind:
        raise UserError(f"{path}: a {got} input given to --{kind}; use --{got}")
    return doc


# -- predict -------------------------------------------------------------------------------------
_CONFIG_OPTIONS = (
    options.specs(
        "--scheme", "schemes",
        f"e.g. reduce-broadcast:overlap=16, ddp, reduce-broadcast:backward=true; "
        f"{', '.join(SCHEMES)} [{' '.join(DEFAULT_SCHEMES)}; fp32 allreduce is always added as "
        "the baseline].",
    ),
    options.specs(
        "--compressor", "compressors", f"NAME[:KEY=VALUE,...] [{' '.join(DEFAULT_COMPRESSORS)}]."
    ),
    options.listed("--backend", "backends", help="[every fitted backend]."),
    options.world_sizes("Ranks [2]."),
    click.option(
        "--nodes", type=int,
        help="Nodes of a cluster (with --ranks-per-node; instead of --world-size): two levels, "
        "--bandwidth between nodes and --intra-bandwidth inside one.",
    ),
    click.option("--ranks-per-node", type=int, help="Ranks on each node (with --nodes)."),
    click.option(
        "--intra-bandwidth", metavar="RATE",
        help="Link inside a node (with --nodes) [unshaped: what 1-node runs measured].",
    ),
    click.option("--model", "workload", metavar="NAME", help="Workload whose fits to use."),
    click.option("--batch-size", type=int, help="Per-rank batch of the workload's fits."),
    click.option(
        "--fp32-numel", default="0", metavar="COUNT",
        help="Values the layer policy keeps in fp32 (aggregated by the same scheme) [0].",
    ),
    click.option(
        "--host-cores", type=int,
        help="Ranks share this many cores on one host: compute and codec x max(1, K / cores).",
    ),
    options.flag("--no-tbf-burst", help="Real links: no credit from the emulator's tbf bucket."),
    click.option(
        "--overlap", type=click.Choice([BACKWARD, FLAT]),
        help="backward: communicate per DDP bucket during backward (the schemes that can); none: "
        "one gradient after it [as each scheme says: ddp and backward=true overlap].",
    ),
    options.table_format(FORMATS),
)  # fmt: skip


def _config_options(f: Any) -> Any:
    for option in reversed(_CONFIG_OPTIONS):
        f = option(f)
    return f


@cost.command(cls=ListCommand)
@click.argument("model_path", metavar="MODEL.json")
@_config_options
@options.listed("--bandwidth", "bandwidths", metavar="RATE",
                help="Link rates, e.g. 1gbit 10gbit, or unshaped [the fitted links].")  # fmt: skip
@options.listed(
    "--model-numel", "numels", metavar="COUNT",
    help="Gradient sizes in values, e.g. 61M 122M (compute stays fixed: a grown model) "
    "[the workload's, else 16.8M = 64 MiB].",
)  # fmt: skip
@click.option("--compute-s", type=float, help="Forward + backward seconds (overrides the fit).")
@click.option("--step-s", type=float, help="Optimizer step seconds (overrides the fit).")
def predict(model_path: str, fmt: str, no_tbf_burst: bool, **options: Any) -> None:
    """Predict iteration time, speedup over fp32 allreduce (and over DDP fp32 where a DDP run
    of the workload was fitted) and scalability (K t(1) / t(K))."""
    m = CostModel.load(model_path)
    configs, notes = build_configs(m, tbf_burst=not no_tbf_burst, **options)
    frame = predict_frame(m, configs)
    print_frame(frame, fmt, show_predictions)
    for note in notes:
        err_console().print(note, highlight=False, markup=False)


@cost.command(cls=ListCommand)
@click.argument("model_path", metavar="MODEL.json")
@_config_options
@options.setting("--min-bandwidth", default="10mbit", metavar="RATE",
                 help="Lowest link rate searched.")  # fmt: skip
@options.setting("--max-bandwidth", default="400gbit", metavar="RATE",
                 help="Highest link rate searched.")  # fmt: skip
def crossover(
    model_path: str, fmt: str, no_tbf_burst: bool, min_bandwidth: str, max_bandwidth: str,
    **options: Any,
) -> None:  # fmt: skip
    """The link rate at which each scheme and compressor beats DDP fp32 (same workload, ranks
    and backend): where their predicted iteration times cross, with both times around it."""
    m = CostModel.load(model_path)
    low = check_rate(min_bandwidth, "--min-bandwidth")
    high = check_rate(max_bandwidth, "--max-bandwidth")
    if not options["workload"]:
        raise UserError("--model NAME is needed: DDP fp32 is predicted from its bucket profile")
    configs, notes = build_configs(
        m, bandwidths=(max_bandwidth,), tbf_burst=not no_tbf_burst, **options
    )  # fmt: skip
    flat_fp32 = [c for c in configs if c.scheme == ALLREDUCE and full_precision(c.compressor)]
    found = [find_crossover(m, c, low, high) for c in configs if c not in flat_fp32]
    if not found:
        raise UserError("nothing to compare with DDP fp32; give --scheme and --compressor")
    show_crossovers(found, fmt)
    for note in notes:
        err_console().print(note, highlight=False, markup=False)


# -- validate ------------------------------------------------------------------------------------
@cost.command()
@click.argument("model_path", metavar="MODEL.json")
@click.argument("paths", nargs=-1, required=True, metavar="DIR|FILE.json...")
@options.flag("--all", "show_all", help="Also list the rows used for fitting.")
@options.table_format(FORMATS)
def validate(model_path: str, paths: tuple[str, ...], show_all: bool, fmt: str) -> None:
    """Predicted vs measured time of bench comm rows and sweep runs, with the error; the summary
    covers the rows NOT used for fitting (target: within 15 %)."""
    m = CostModel.load(model_path)
    frame = validate_paths(m, paths)
    if frame.empty:
        raise UserError(f"nothing to validate in {', '.join(paths)}")
    shown = frame if show_all else frame[~frame["in_fit"].astype(bool)]
    print_frame(shown, fmt, show_validation)
    none = "no held-out rows with a prediction (all were used for fitting; see --all)"
    err_console().print(held_out_line(frame, "rows", none), highlight=False)


# -- utilization ---------------------------------------------------------------------------------
@cost.command()
@click.argument("results", metavar="DIR")
@click.option("--model", "model_path", metavar="MODEL.json", help="A fitted cost model (`qbench "
              "cost fit --comm ...`): time each phase by its collective's fit instead of the "
              "link's full rate.")  # fmt: skip
@options.flag("--all", "show_all", help="Also list the loopback runs the curves are fitted on.")
@options.table_format(FORMATS)
def utilization(results: str, model_path: str | None, show_all: bool, fmt: str) -> None:
    """Compute utilization against link rate: each method's curve, fitted on its loopback run
    from its declared traffic, scored against its runs on shaped links (held out), and the
    link rate it needs for 50, 90 and 99 %."""
    if not Path(results).is_dir():
        raise UserError(f"{results}: not a results directory; give `qbench sweep --out` DIR")
    transfer = IDEAL if model_path is None else FittedTransfer(CostModel.load(model_path))
    fitted = fit_utilization(results, transfer)
    frame = check_utilization(fitted)
    if frame.empty:
        raise UserError(f"{results}: no method with a run over an unshaped link to fit on")
    shown = frame if show_all else frame[~frame["in_fit"].astype(bool)]
    print_frame(shown, fmt, show_utilization)
    if fmt == "table":
        show_needed(needed_rates(fitted))
    none = "no run on a shaped link to check the curves against (see --all)"
    err_console().print(held_out_line(frame, "runs on shaped links", none), highlight=False)
