"""Tables of ``qbench cost``: fitted parameters, predictions and validation, for people
(rich tables, times in ms) or programs (``--format csv|json``)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click
import pandas as pd
from rich.console import Console
from rich.table import Table

from qbench.costmodel.crossover import ALWAYS, CROSSES, Crossover
from qbench.costmodel.model import CostModel
from qbench.costmodel.schemes import BACKWARD
from qbench.costmodel.validate import summarize_validation

FORMATS = ("table", "csv", "json")


def out_console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 200)


def err_console() -> Console:
    return Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def show_fit(m: CostModel) -> None:
    out = out_console()
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
                _time(c.credit_s), f"{c.r2:.3f}", str(c.points), pct(c.rel_err_median),
                pct(c.rel_err_max),
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
    if m.buckets:
        t = Table(title="DDP buckets (medians; hand-over after backward started)")
        for col in ("workload", "batch", "device", "K", "cap", "buckets", "values", "forward",
                    "backward", "last hand-over", "step", "imbalance", "from", "runs"):  # fmt: skip
            t.add_column(col)
        for b in m.buckets:
            t.add_row(
                b.workload, str(b.batch_size), b.device, str(b.world_size),
                f"{b.bucket_cap_mb:g} MB", str(len(b.numel)), f"{sum(b.numel):,}",
                _time(b.forward_s), _time(b.backward_s), _time(max(b.handed_s, default=0.0)),
                _time(b.step_s), f"{b.imbalance:.3f}",
                b.measured + "".join(f" +{k} payloads" for k in b.payload_bytes), str(b.runs),
            )  # fmt: skip
        out.print(t)
    for note in dict.fromkeys(m.notes):
        err_console().print(note, highlight=False, markup=False)


def show_predictions(frame: pd.DataFrame) -> None:
    ddp = bool((frame["mode"] == BACKWARD).any() or frame["speedup_vs_ddp"].notna().any())
    title = "predicted iteration time (ms)"
    if ddp:
        title += "; DDP (mode backward): comm is the exposed part, comm all the whole"
    t = Table(title=title)
    left = ("backend", "link", "K", "values", "workload", "scheme", "compressor", "mode")
    for col in left:
        t.add_column(col)
    parts = ("compute", "encode", "comm", *(("comm all",) if ddp else ()), "decode", "step")
    right = (*parts, "wait", "total", "speedup", *(("vs ddp",) if ddp else ()), "scalab.")
    for col in right:
        t.add_column(col, justify="right")
    for r in frame.itertuples(index=False):
        times = [ms(getattr(r, p)) for p in _PARTS]
        t.add_row(
            r.backend, r.network, str(r.world_size), _count(r.numel), r.workload or "-",
            r.scheme, r.compressor, r.mode, *times[:3], *((ms(r.comm_total_s),) if ddp else ()),
            *times[3:], f"{r.speedup_vs_fp32:.2f}x",
            *((_times(r.speedup_vs_ddp),) if ddp else ()), f"{r.scalability:.2f}",
        )  # fmt: skip
    out_console().print(t)
    notes = sorted({n for ns in frame["notes"] for n in str(ns).split("; ") if n})
    for n in notes:
        err_console().print(f"note: {n}", highlight=False, markup=False)


_PARTS = ("compute_s", "encode_s", "comm_s", "decode_s", "step_s", "wait_s", "total_s")


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
            _mib(r.numel), r.workload or "-", str(r.runs), ms(r.measured_s), ms(r.predicted_s),
            pct(r.error, signed=True), ms(r.measured_comm_s), ms(r.predicted_comm_s),
            "yes" if r.in_fit else "",
        )  # fmt: skip
    out_console().print(t)


def print_frame(frame: pd.DataFrame, fmt: str, table: Any) -> None:
    if fmt == "csv":
        click.echo(frame.to_csv(index=False), nl=False)
    elif fmt == "json":
        records = json.loads(frame.to_json(orient="records"))
        click.echo(json.dumps(records, indent=2))
    else:
        table(frame)


def ms(x: float) -> str:
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


def pct(x: float, signed: bool = False) -> str:
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


CROSSOVER_COLUMNS = (
    *("backend", "world_size", "workload", "scheme", "compressor", "verdict", "crossover_bps"),
    *("rate_bps", "total_s", "ddp_total_s", "speedup_vs_ddp"),
)


def crossover_frame(found: list[Crossover]) -> pd.DataFrame:
    """One row per rate shown, with the verdict and the (first) crossover rate."""
    rows = []
    for x in found:
        c = x.config
        for rate, mine, ddp in x.points:
            rows.append({
                "backend": c.backend, "world_size": c.world_size, "workload": c.workload or "",
                "scheme": c.scheme.label, "compressor": c.compressor.label, "verdict": x.verdict,
                "crossover_bps": x.rates_bps[0] if x.rates_bps else math.nan, "rate_bps": rate,
                "total_s": mine, "ddp_total_s": ddp, "speedup_vs_ddp": ddp / mine,
            })  # fmt: skip
    return pd.DataFrame(rows, columns=list(CROSSOVER_COLUMNS))


def show_crossovers(found: list[Crossover], fmt: str) -> None:
    if fmt != "table":
        print_frame(crossover_frame(found), fmt, None)
        return
    t = Table(title="predicted iteration time (ms) against DDP fp32")
    for col in ("backend", "K", "scheme", "compressor", "link"):
        t.add_column(col)
    for col in ("predicted", "DDP fp32", "speedup"):
        t.add_column(col, justify="right")
    for x in found:
        c = x.config
        for rate, mine, ddp in x.points:
            t.add_row(
                c.backend, str(c.world_size), c.scheme.label, c.compressor.label, rate_text(rate),
                ms(mine), ms(ddp), f"{ddp / mine:.2f}x",
            )  # fmt: skip
    out_console().print(t)
    for x in found:
        out_console().print(crossover_line(x), highlight=False, markup=False)


def crossover_line(x: Crossover) -> str:
    """``gloo K=2 ... qsgd-4b-b512: faster than DDP fp32 below 3.4 Gbit/s``."""
    c = x.config
    head = f"{c.backend} K={c.world_size} {c.workload} {c.scheme.label} {c.compressor.label}:"
    if x.verdict != CROSSES:
        span = f"{rate_text(x.points[0][0])} .. {rate_text(x.points[-1][0])}"
        if x.verdict == ALWAYS:
            return f"{head} faster than DDP fp32 at every rate in {span}"
        return f"{head} never faster than DDP fp32 in {span}"
    parts = [
        f"{'faster' if below else 'slower'} than DDP fp32 below {rate_text(r)}"
        for r, below in zip(x.rates_bps, x.faster_below, strict=True)
    ]
    return f"{head} " + "; ".join(parts)


def _times(x: float) -> str:
    return f"{x:.2f}x" if math.isfinite(x) else "-"


def rate_text(bps: float) -> str:
    for div, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s")):
        if bps >= div:
            return f"{bps / div:.3g} {unit}"
    return f"{bps / 1e3:.3g} kbit/s"


def show_utilization(frame: pd.DataFrame) -> None:
    t = Table(
        title="compute utilization, measured (95 % CI over rounds) vs the curve fitted on each "
        "method's loopback run; error = predicted / measured - 1"
    )
    for col in ("scheme", "compressor", "link", "H"):
        t.add_column(col)
    for col in ("measured", "95 % CI", "predicted", "error", "bytes/round", "declared", "fit"):
        t.add_column(col, justify="right")
    for r in frame.itertuples(index=False):
        t.add_row(
            r.scheme, r.compressor, r.network, str(r.H), pct(r.measured),
            f"{pct(r.low)}-{pct(r.high)}", pct(r.predicted),
            "" if r.in_fit else pct(r.error, signed=True), f"{r.bytes_round:,.0f}",
            f"{r.wire_round:,.0f}", "yes" if r.in_fit else "",
        )  # fmt: skip
    out_console().print(t)


def show_needed(frame: pd.DataFrame) -> None:
    t = Table(title="link rate the fitted curve needs for each utilization (no token bucket)")
    for col in ("scheme", "compressor"):
        t.add_column(col)
    rates = [c for c in frame.columns if c.startswith("bps_")]
    for col in rates:
        t.add_column(f"{col[4:]} %", justify="right")
    for r in frame.to_dict("records"):
        cells = [rate_text(r[c]) if math.isfinite(r[c]) else "never" for c in rates]
        t.add_row(str(r["scheme"]), str(r["compressor"]), *cells)
    out_console().print(t)


def held_out_line(frame: pd.DataFrame, rows: str, none: str) -> str:
    """The summary under a validation table: the held-out ``rows``' errors, or ``none``."""
    s = summarize_validation(frame)
    if not s.points:
        return none
    return (
        f"held out: {s.points} {rows}, median |error| {pct(s.median_abs_error)}, max "
        f"{pct(s.max_abs_error)}, {s.within_target}/{s.points} within {s.target:.0%}"
    )
