"""``qbench cost fit | predict | validate``: the calibrated cost model on the command line.

Registered in ``qbench/cli.py`` with ``cli.add_command(cost_cli.cost)``, and under its old name
``qbench model`` (hidden, ``moved``), which says on stderr that it moved. The maths lives in
``qbench.costmodel``; this module parses options and builds configurations, and
``qbench.cost_render`` prints the tables.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from qbench.clitools import ListCommand
from qbench.cost_render import (
    FORMATS,
    err_console,
    pct,
    print_frame,
    show_fit,
    show_predictions,
    show_validation,
)
from qbench.costmodel.config import Config
from qbench.costmodel.fit import fit as fit_model
from qbench.costmodel.inputs import load_input
from qbench.costmodel.model import CostModel, compute_fits
from qbench.costmodel.predict import predict_frame
from qbench.costmodel.schemes import FP32, PROJECTED, SCHEMES, Scheme, incompatibility
from qbench.costmodel.validate import summarize_validation
from qbench.costmodel.validate import validate as validate_paths
from qbench.errors import UserError

DEFAULT_SCHEMES = ("allreduce", "reduce-broadcast", "integer-allreduce", PROJECTED)
DEFAULT_COMPRESSORS = ("qsgd:bits=4,bucket_size=512",)
DEFAULT_NUMEL = 2**24
"""A 64 MiB fp32 gradient (bench comm's default largest size) when no size or workload is given."""


@click.group()
def cost() -> None:
    """Cost model: fit alpha-beta, codec and compute parameters; predict; validate."""


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
@click.option(
    "--comm", "comm_files", multiple=True, metavar="FILE.json",
    help="`qbench bench comm --json` output(s): alpha-beta of each collective, codec phases.",
)  # fmt: skip
@click.option(
    "--kernels", "kernel_files", multiple=True, metavar="FILE.json",
    help="`qbench bench kernels --json` output(s): encode/decode seconds per element.",
)  # fmt: skip
@click.option(
    "--comm-from-runs", is_flag=True,
    help="Also fit collectives from the runs' t_comm vs bytes_sent (approximate: layer groups).",
)  # fmt: skip
@click.option(
    "--hold-out", "hold_out", multiple=True, metavar="LABEL=VALUE",
    help="Leave runs with this label value out of the fit (e.g. world_size=4, network=300mbit), "
    "so that `cost validate` scores them as held-out.",
)  # fmt: skip
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Model JSON to write.")
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
@cost.command(cls=ListCommand)
@click.argument("model_path", metavar="MODEL.json")
@click.option(
    "--scheme", "schemes", multiple=True, metavar="SPEC",
    help=f"e.g. reduce-broadcast:overlap=16; {', '.join(SCHEMES)} "
    f"[{' '.join(DEFAULT_SCHEMES)}; fp32 allreduce is always added as the baseline].",
)  # fmt: skip
@click.option(
    "--compressor", "compressors", multiple=True, metavar="SPEC",
    help=f"NAME[:KEY=VALUE,...] [{' '.join(DEFAULT_COMPRESSORS)}].",
)  # fmt: skip
@click.option("--backend", "backends", multiple=True, help="[every fitted backend].")
@click.option("--world-size", "world_sizes", multiple=True, type=int, help="Ranks [2].")
@click.option(
    "--bandwidth", "bandwidths", multiple=True, metavar="RATE",
    help="Link rates, e.g. 1gbit 10gbit, or unshaped [the fitted links].",
)  # fmt: skip
@click.option(
    "--model-numel", "numels", multiple=True, metavar="COUNT",
    help="Gradient sizes in values, e.g. 61M 122M (compute stays fixed: a grown model) "
    "[the workload's, else 16.8M = 64 MiB].",
)  # fmt: skip
@click.option("--model", "workload", metavar="NAME", help="Workload whose fitted compute to use.")
@click.option("--batch-size", type=int, help="Per-rank batch of the workload's compute fit.")
@click.option("--compute-s", type=float, help="Forward + backward seconds (overrides the fit).")
@click.option("--step-s", type=float, help="Optimizer step seconds (overrides the fit).")
@click.option(
    "--fp32-numel", default="0", metavar="COUNT",
    help="Values the layer policy keeps in fp32 (aggregated by the same scheme) [0].",
)  # fmt: skip
@click.option(
    "--host-cores", type=int,
    help="Ranks share this many cores on one host: compute and codec x max(1, K / cores).",
)  # fmt: skip
@click.option(
    "--no-tbf-burst", is_flag=True,
    help="Real links: no credit from the emulator's tbf bucket.",
)  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def predict(
    model_path: str, schemes: tuple[str, ...], compressors: tuple[str, ...],
    backends: tuple[str, ...], world_sizes: tuple[int, ...], bandwidths: tuple[str, ...],
    numels: tuple[str, ...], workload: str | None, batch_size: int | None,
    compute_s: float | None, step_s: float | None, fp32_numel: str, host_cores: int | None,
    no_tbf_burst: bool, fmt: str,
) -> None:  # fmt: skip
    """Predict iteration time, speedup over fp32 allreduce and scalability (K t(1) / t(K))."""
    m = CostModel.load(model_path)
    configs, notes = build_configs(
        m, schemes=schemes, compressors=compressors, backends=backends, world_sizes=world_sizes,
        bandwidths=bandwidths, numels=numels, workload=workload, batch_size=batch_size,
        compute_s=compute_s, step_s=step_s, fp32_numel=fp32_numel, host_cores=host_cores,
        tbf_burst=not no_tbf_burst,
    )  # fmt: skip
    frame = predict_frame(m, configs)
    print_frame(frame, fmt, show_predictions)
    for note in notes:
        err_console().print(note, highlight=False, markup=False)


def build_configs(
    m: CostModel, *, schemes: Sequence[str] = (), compressors: Sequence[str] = (),
    backends: Sequence[str] = (), world_sizes: Sequence[int] = (),
    bandwidths: Sequence[str] = (), numels: Sequence[str] = (), workload: str | None = None,
    batch_size: int | None = None, compute_s: float | None = None, step_s: float | None = None,
    fp32_numel: str = "0", host_cores: int | None = None, tbf_burst: bool = True,
) -> tuple[list[Config], list[str]]:  # fmt: skip
    """Every combination of the options (fp32 allreduce first); notes say what was skipped."""
    for k in world_sizes:
        if k < 1:
            raise UserError(f"--world-size must be >= 1, got {k}; e.g. `--world-size 2 4 8`")
    if host_cores is not None and host_cores < 1:
        raise UserError(f"--host-cores must be >= 1, got {host_cores}")
    for name, v in (("--compute-s", compute_s), ("--step-s", step_s)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise UserError(f"{name} must be seconds >= 0, got {v}")
    scheme_list = [Scheme.parse(s) for s in schemes or DEFAULT_SCHEMES]
    comps = [compressor_info(c, m) for c in (compressors or DEFAULT_COMPRESSORS)]
    nets = [_network(b) for b in bandwidths] or m.networks
    backs = list(backends) or m.backends
    if not nets or not backs:
        raise UserError("the model has no fitted collectives; fit it with `--comm FILE.json`")
    unknown = [b for b in backs if b not in m.backends]
    if unknown:
        raise UserError(
            f"backend {unknown[0]!r} not in the model; fitted: {', '.join(m.backends) or 'none'}"
        )
    sizes: list[int | None] = [count(n, "--model-numel") for n in numels]
    if not sizes:
        sizes = [None] if workload and compute_fits(m, workload) else [DEFAULT_NUMEL]
    f32 = count(fp32_numel, "--fp32-numel", minimum=0)
    combos: list[tuple[Scheme, tuple[str, float]]] = [(Scheme("allreduce"), (FP32, 32.0))]
    notes: list[str] = []
    for s, c in itertools.product(scheme_list, comps):
        if s.name == "allreduce" and c[0] == FP32:
            continue
        why = incompatibility(s, c[0])
        if why:
            notes.append(f"skipped {s.label} {c[0]}: {why}")
        elif (s, c) not in combos:
            combos.append((s, c))
    configs = []
    for back, net, k, n, (s, (label, bits)) in itertools.product(
        backs, nets, world_sizes or (2,), sizes, combos
    ):
        configs.append(Config(
            scheme=s.label, compressor=label, bits_per_value=bits, backend=back, network=net,
            world_size=k, numel=n, fp32_numel=f32 if label != FP32 else 0,
            workload=workload, batch_size=batch_size, compute_s=compute_s, step_s=step_s,
            host_cores=host_cores, tbf_burst=tbf_burst,
        ))  # fmt: skip
    return configs, notes


def compressor_info(spec: str, m: CostModel) -> tuple[str, float]:
    """(label, wire bits per value) of a compressor spec, built by ``qbench.compress``."""
    from qbench import compress
    from qbench.bench.kernels import parse_spec

    s = parse_spec(spec)
    params = {k: v for k, v in s.items() if k != "name"}
    if s["name"] not in compress.COMPRESSORS:
        raise UserError(
            f"unknown compressor {s['name']!r}; valid: {', '.join(sorted(compress.COMPRESSORS))}"
        )
    c = compress.build(s["name"], **params)
    if c.fixed_size:
        n = 2**20
        return c.label, 8 * c.wire_nbytes(n) / n
    if c.label in m.compressors:
        return c.label, m.compressors[c.label]
    raise UserError(
        f"{c.label}: payload size depends on the data and the model has no measurement of it; "
        "fit with bench data that includes it"
    )


def _network(text: str) -> str:
    t = text.strip().lower().replace(" ", "")
    if t == "unshaped":
        return t
    from qbench import network

    try:
        network.bits_per_s(t)
    except UserError:
        raise UserError(
            f"--bandwidth must be a rate in kbit/mbit/gbit or `unshaped`, got {text!r}; "
            "e.g. `--bandwidth 1gbit 10gbit`"
        ) from None
    return t


def count(text: str, option: str, minimum: int = 1) -> int:
    """``61M``, ``2.5e6``, ``500k``, ``25_000_000`` -> int (UserError otherwise)."""
    from qbench.models import params

    try:
        return params.count(minimum)(str(text))
    except ValueError as e:
        raise UserError(f"{option} must be {e}, got {text!r}") from None


# -- validate ------------------------------------------------------------------------------------
@cost.command()
@click.argument("model_path", metavar="MODEL.json")
@click.argument("paths", nargs=-1, required=True, metavar="DIR|FILE.json...")
@click.option("--all", "show_all", is_flag=True, help="Also list the rows used for fitting.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def validate(model_path: str, paths: tuple[str, ...], show_all: bool, fmt: str) -> None:
    """Predicted vs measured time of bench comm rows and sweep runs, with the error; the summary
    covers the rows NOT used for fitting (target: within 15 %)."""
    m = CostModel.load(model_path)
    frame = validate_paths(m, paths)
    if frame.empty:
        raise UserError(f"nothing to validate in {', '.join(paths)}")
    shown = frame if show_all else frame[~frame["in_fit"].astype(bool)]
    print_frame(shown, fmt, show_validation)
    s = summarize_validation(frame)
    line = (
        f"held out: {s.points} rows, median |error| {pct(s.median_abs_error)}, max "
        f"{pct(s.max_abs_error)}, {s.within_target}/{s.points} within {s.target:.0%}"
        if s.points
        else "no held-out rows with a prediction (all were used for fitting; see --all)"
    )
    err_console().print(line, highlight=False)
