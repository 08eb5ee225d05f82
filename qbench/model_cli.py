"""``qbench model fit | predict | validate``: the calibrated cost model on the command line.

Registered in ``qbench/cli.py`` with ``cli.add_command(model_cli.model)``. The maths lives in
``qbench.costmodel``; this module parses options, builds configurations and prints tables.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import pandas as pd
from rich.console import Console
from rich.table import Table

from qbench import costmodel
from qbench.clitools import ListCommand
from qbench.costmodel import Config, CostModel
from qbench.errors import UserError

DEFAULT_SCHEMES = ("allreduce", "reduce-broadcast", "integer-allreduce", costmodel.PROJECTED)
DEFAULT_COMPRESSORS = ("qsgd:bits=4,bucket_size=512",)
DEFAULT_NUMEL = 2**24
"""A 64 MiB fp32 gradient (bench comm's default largest size) when no size or workload is given."""
FORMATS = ("table", "csv", "json")


def _out() -> Console:
    return Console(width=None if sys.stdout.isatty() else 200)


def _err() -> Console:
    return Console(stderr=True, width=None if sys.stderr.isatty() else 200)


@click.group()
def model() -> None:
    """Cost model: fit alpha-beta, codec and compute parameters; predict; validate."""


# -- fit -----------------------------------------------------------------------------------------
@model.command(cls=ListCommand)
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
    "so that `model validate` scores them as held-out.",
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
    m = costmodel.fit(
        comm_docs=[(_json(f, "comm"), f) for f in comm_files],
        kernel_docs=[(_json(f, "kernels"), f) for f in kernel_files],
        run_dirs=list(dirs), comm_from_runs=comm_from_runs, hold_out=pairs,
    )  # fmt: skip
    m.save(out)
    show_fit(m)
    _err().print(f"wrote {out}", highlight=False)


def _json(path: str, kind: str) -> Any:
    got, doc = costmodel.load_input(path)
    if got != kind:
        raise UserError(f"{path}: a {got} input given to --{kind}; use --{got}")
    return doc


def show_fit(m: CostModel) -> None:
    out = _out()
    if m.collectives:
        t = Table(title="collectives: t = msgs·alpha + Σ_calls max(0, wire·beta − credit)")
        for col in ("backend", "network", "collective"):
            t.add_column(col)
        for col in ("alpha", "beta → rate", "credit", "R²", "points", "median err", "max err"):
            t.add_column(col, justify="right")
        for c in m.collectives:
            rate = 8 / c.beta_s_per_byte / 1e9 if c.beta_s_per_byte > 0 else math.inf
            t.add_row(
                c.backend, c.network, c.collective, _time(c.alpha_s), f"{rate:.3g} Gbit/s",
                _time(c.credit_s), f"{c.r2:.3f}", str(c.points), _pct(c.rel_err_median),
                _pct(c.rel_err_max),
            )  # fmt: skip
        out.print(t)
    if m.phases or m.kernels:
        t = Table(title="codec: t = c0 + c1 · elements")
        for col in ("source", "scheme", "compressor", "op", "c0", "c1 per element", "R²", "points"):
            t.add_column(col)
        for p in [*m.phases, *m.kernels]:
            src = p.backend or f"kernels/{p.device}"
            t.add_row(
                src, p.scheme or "-", p.compressor or "(copy)", p.op, _time(p.c0_s),
                f"{p.c1_s * 1e9:.3g} ns", f"{p.r2:.3f}", str(p.points),
            )  # fmt: skip
        out.print(t)
    if m.compute:
        t = Table(title="compute (medians over runs; per rank on a core of its own, then as "
                  "measured at each world size)")  # fmt: skip
        for col in ("workload", "batch", "device", "compute", "step", "numel", "runs", "ranks"):
            t.add_column(col)
        t.add_column("compute at K")
        for w in m.compute:
            at_k = ", ".join(f"{k}: {_time(v[0])}" for k, v in w.per_world_size.items())
            t.add_row(
                w.workload, str(w.batch_size), w.device, _time(w.compute_s), _time(w.step_s),
                f"{w.numel:,}", str(w.runs), ",".join(map(str, w.world_sizes)), at_k or "-",
            )  # fmt: skip
        out.print(t)
    if m.imbalance:
        t = Table(title="imbalance: iteration (slowest rank) / sum of phases (rank means)")
        for col in ("backend", "scheme", "K", "ratio"):
            t.add_column(col, justify="right" if col in ("K", "ratio") else "left")
        for key, ratio in m.imbalance.items():
            backend, scheme, k = key.rsplit("/", 2)
            t.add_row(backend, scheme, k, f"{ratio:.3f}")
        out.print(t)
    for note in dict.fromkeys(m.notes):
        _err().print(note, highlight=False, markup=False)


# -- predict -------------------------------------------------------------------------------------
@model.command(cls=ListCommand)
@click.argument("model_path", metavar="MODEL.json")
@click.option(
    "--scheme", "schemes", multiple=True, metavar="SPEC",
    help=f"e.g. reduce-broadcast:overlap=16; {', '.join(costmodel.SCHEMES)} "
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
    frame = costmodel.predict_frame(m, configs)
    _print_frame(frame, fmt, show_predictions)
    for note in notes:
        _err().print(note, highlight=False, markup=False)


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
    scheme_list = [costmodel.Scheme.parse(s) for s in schemes or DEFAULT_SCHEMES]
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
        sizes = [None] if workload and costmodel.compute_fits(m, workload) else [DEFAULT_NUMEL]
    f32 = count(fp32_numel, "--fp32-numel", minimum=0)
    combos: list[tuple[costmodel.Scheme, tuple[str, float]]] = [
        (costmodel.Scheme("allreduce"), (costmodel.FP32, 32.0))
    ]
    notes: list[str] = []
    for s, c in itertools.product(scheme_list, comps):
        if s.name == "allreduce" and c[0] == costmodel.FP32:
            continue
        why = costmodel.incompatibility(s, c[0])
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
            world_size=k, numel=n, fp32_numel=f32 if label != costmodel.FP32 else 0,
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
    from qbench.catalog import model_params as params

    try:
        return params.count(minimum)(str(text))
    except ValueError as e:
        raise UserError(f"{option} must be {e}, got {text!r}") from None


def show_predictions(frame: pd.DataFrame) -> None:
    t = Table(title="predicted iteration time (ms)")
    left = ("backend", "link", "K", "values", "workload", "scheme", "compressor", "mode")
    for col in left:
        t.add_column(col)
    for col in ("compute", "encode", "comm", "decode", "step", "wait", "total", "speedup",
                "scalab."):  # fmt: skip
        t.add_column(col, justify="right")
    for r in frame.itertuples(index=False):
        t.add_row(
            r.backend, r.network, str(r.world_size), _count(r.numel), r.workload or "-",
            r.scheme, r.compressor, r.mode, *(_ms(getattr(r, p)) for p in _PARTS),
            f"{r.speedup_vs_fp32:.2f}x", f"{r.scalability:.2f}",
        )  # fmt: skip
    _out().print(t)
    notes = sorted({n for ns in frame["notes"] for n in str(ns).split("; ") if n})
    for n in notes:
        _err().print(f"note: {n}", highlight=False, markup=False)


_PARTS = ("compute_s", "encode_s", "comm_s", "decode_s", "step_s", "wait_s", "total_s")


# -- validate ------------------------------------------------------------------------------------
@model.command()
@click.argument("model_path", metavar="MODEL.json")
@click.argument("paths", nargs=-1, required=True, metavar="DIR|FILE.json...")
@click.option("--all", "show_all", is_flag=True, help="Also list the rows used for fitting.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def validate(model_path: str, paths: tuple[str, ...], show_all: bool, fmt: str) -> None:
    """Predicted vs measured time of bench comm rows and sweep runs, with the error; the summary
    covers the rows NOT used for fitting (target: within 15 %)."""
    m = CostModel.load(model_path)
    frame = costmodel.validate(m, paths)
    if frame.empty:
        raise UserError(f"nothing to validate in {', '.join(paths)}")
    shown = frame if show_all else frame[~frame["in_fit"].astype(bool)]
    _print_frame(shown, fmt, show_validation)
    s = costmodel.summarize_validation(frame)
    line = (
        f"held out: {s.points} rows, median |error| {_pct(s.median_abs_error)}, max "
        f"{_pct(s.max_abs_error)}, {s.within_target}/{s.points} within {s.target:.0%}"
        if s.points
        else "no held-out rows with a prediction (all were used for fitting; see --all)"
    )
    _err().print(line, highlight=False)


def show_validation(frame: pd.DataFrame) -> None:
    t = Table(
        title="predicted vs measured (ms; runs: median over seeds/repeats); error = predicted "
        "/ measured - 1"
    )
    for col in ("source", "backend", "link", "K", "scheme", "compressor", "gradient", "workload"):
        t.add_column(col)
    for col in ("runs", "measured", "predicted", "error", "comm meas.", "comm pred.", "fit"):
        t.add_column(col, justify="right")
    for r in frame.itertuples(index=False):
        t.add_row(
            Path(r.source).name, r.backend, r.network, str(r.world_size), r.scheme, r.compressor,
            _mib(r.numel), r.workload or "-", str(r.runs), _ms(r.measured_s), _ms(r.predicted_s),
            _pct(r.error, signed=True), _ms(r.measured_comm_s), _ms(r.predicted_comm_s),
            "yes" if r.in_fit else "",
        )  # fmt: skip
    _out().print(t)


# -- output helpers ------------------------------------------------------------------------------
def _print_frame(frame: pd.DataFrame, fmt: str, table: Any) -> None:
    if fmt == "csv":
        click.echo(frame.to_csv(index=False), nl=False)
    elif fmt == "json":
        records = json.loads(frame.to_json(orient="records"))
        click.echo(json.dumps(records, indent=2))
    else:
        table(frame)


def _ms(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    ms = x * 1e3
    return f"{ms:,.0f}" if abs(ms) >= 100 else f"{ms:.3g}"


def _time(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    if x < 1e-3:
        return f"{x * 1e6:.3g} µs"
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


def _pct(x: float, signed: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x * 100:+.1f} %" if signed else f"{x * 100:.1f} %"


def _mib(numel: Any) -> str:
    """fp32 gradient size of ``numel`` values, as bench comm labels sizes."""
    mib = 4 * float(numel) / 2**20
    return f"{mib:.3g} MiB" if math.isfinite(mib) else "-"


def _count(n: Any) -> str:
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return "-"
    n = float(n)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:.0f}"
