"""``qbench bench numerics`` documents for people: per (format, order, K) the median relative
error over repeats with its 95 % interval, the bias with its noise floor, the cosine
similarity; per (format, order) how the error grows with K; and the terminal tables.

Reads the document only (numpy, never torch), so a saved ``--json`` file summarises the same:

* median relative error over the R repeats, with the percentile bootstrap interval of the
  median (``qbench.report.intervals.bootstrap``: its resamples and fixed seed);
* bias = ||mean over repeats of (est - mean)|| / mean ||mean||. It still holds the noise of R
  repeats: for an unbiased format it is about rms(error) / sqrt(R), the noise floor beside it;
  a bias well above its floor is real;
* growth: the slope of log(median relative error) against log(K), least squares over the K
  measured (0.5: the error grows as sqrt(K); 0: flat; -0.5: it averages out as 1/sqrt(K)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from qbench.report import intervals
from qbench.spec.codec_times import bench_rows

SCHEMA = "qbench.bench.numerics/1"
"""The document's schema (``qbench.bench.numerics.SCHEMA``; tests keep the two equal)."""
_NEED = ("compressor", "order", "ranks", "status", "samples", "bias_norm")


@dataclass(frozen=True, kw_only=True)
class Summary:
    compressor: str
    order: str
    ranks: int
    status: str
    reason: str
    repeats: int
    """Samples behind the numbers (the finite ones)."""
    median: float
    """Median relative error ||est - mean|| / ||mean|| over the repeats."""
    low: float
    high: float
    """95 % interval of the median."""
    bias: float
    noise_floor: float
    """rms relative error / sqrt(repeats): what ``bias`` reads for an unbiased format."""
    cosine: float
    """Median cosine similarity of est and mean."""
    calls: int


@dataclass(frozen=True, kw_only=True)
class Growth:
    compressor: str
    order: str
    slope: float
    """d log(median relative error) / d log(K); NaN with fewer than two K."""
    points: int


def rows(doc: Any, source: str) -> list[dict[str, Any]]:
    """The rows of a ``qbench bench numerics --json`` document (UserError if it is not one)."""
    return bench_rows(doc, source, SCHEMA, "qbench bench numerics", _NEED)


def _floats(samples: Sequence[dict[str, Any]], key: str) -> np.ndarray:
    values = np.array([math.nan if s.get(key) is None else s[key] for s in samples], float)
    return values[~np.isnan(values)]


def summarize(found: Sequence[dict[str, Any]]) -> list[Summary]:
    """One summary per document row, in its order."""
    return [_summary(r) for r in found]


def _summary(row: dict[str, Any]) -> Summary:
    samples = row["samples"] if row["status"] == "ok" else []
    rel = _floats(samples, "rel_error")
    nan = math.nan
    median, low, high, bias, floor, cosine = nan, nan, nan, nan, nan, nan
    if len(rel):
        median = float(np.median(rel))
        # the interval of a median: the bootstrap of median(rel*) / median(1*) = median(rel*)
        low, high = intervals.bootstrap(np.ones(1), rel)
        scale = float(np.mean(_floats(samples, "mean_norm")))
        errors = _floats(samples, "error_norm")
        bias_norm = nan if row["bias_norm"] is None else float(row["bias_norm"])
        bias = bias_norm / scale
        floor = math.sqrt(float(np.mean(errors**2)) / len(errors)) / scale
        cosine = float(np.median(_floats(samples, "cosine")))
    return Summary(
        compressor=row["compressor"], order=row["order"], ranks=int(row["ranks"]),
        status=row["status"], reason=row.get("reason", ""), repeats=len(rel), median=median,
        low=low, high=high, bias=bias, noise_floor=floor, cosine=cosine,
        calls=int(row.get("calls", 0)),
    )  # fmt: skip


def growth(summaries: Sequence[Summary]) -> list[Growth]:
    """Per (format, order), the slope of log median relative error over log K."""
    found = []
    for key in dict.fromkeys((s.compressor, s.order) for s in summaries):
        points = [
            (math.log(s.ranks), math.log(s.median))
            for s in summaries
            if (s.compressor, s.order) == key and math.isfinite(s.median) and s.median > 0
        ]
        slope = math.nan
        if len({x for x, _ in points}) >= 2:
            xs, ys = np.array(points).T
            slope = float(np.polyfit(xs, ys, 1)[0])
        found.append(Growth(compressor=key[0], order=key[1], slope=slope, points=len(points)))
    return found


def with_summary(doc: dict[str, Any], source: str = "the document") -> dict[str, Any]:
    """``doc`` with ``summary`` (one per row) and ``growth`` (one per format and order)."""
    summaries = summarize(rows(doc, source))
    return {
        **doc,
        "summary": [_strict(asdict(s)) for s in summaries],
        "growth": [_strict(asdict(g)) for g in growth(summaries)],
    }


def _strict(d: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}


# -- tables --------------------------------------------------------------------------------------
def _g(value: float, digits: int = 2) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.{digits}g}"


def growth_table(summaries: Sequence[Summary], title: str) -> Table:
    """One line per (format, order): the median relative error at each K, then the slope."""
    ks = sorted({s.ranks for s in summaries})
    t = Table(title=title, caption="slope: d log(error) / d log(K); 0.5: grows as sqrt(K), "
              "0: flat, -0.5: averages out as 1/sqrt(K)")  # fmt: skip
    t.add_column("format")
    t.add_column("order")
    for k in ks:
        t.add_column(f"K={k}", justify="right")
    t.add_column("slope", justify="right")
    slopes = {(g.compressor, g.order): g.slope for g in growth(summaries)}
    for fmt in dict.fromkeys(s.compressor for s in summaries):
        mine = [s for s in summaries if s.compressor == fmt]
        for order in dict.fromkeys(s.order for s in mine):
            at = {s.ranks: s for s in mine if s.order == order}
            cells = [_g(at[k].median) if k in at else "" for k in ks]
            t.add_row(fmt, order, *cells, _g(slopes[(fmt, order)]))
        t.add_section()
    return t


def detail_table(summaries: Sequence[Summary], title: str) -> Table:
    """Per (format, order), its largest K measured: error, interval, bias, floor, 1 - cos."""
    t = Table(title=title)
    for col in ("format", "order", "K", "rel. error", "95% interval", "bias", "noise floor",
                "1 - cos", "messages"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("format", "order") else "right")
    for fmt in dict.fromkeys(s.compressor for s in summaries):
        mine = [s for s in summaries if s.compressor == fmt and s.status == "ok"]
        for order in dict.fromkeys(s.order for s in mine):
            s = max((s for s in mine if s.order == order), key=lambda s: s.ranks)
            t.add_row(
                fmt, order, str(s.ranks), _g(s.median, 3), f"{_g(s.low)}-{_g(s.high)}",
                _g(s.bias), _g(s.noise_floor), _g(1.0 - s.cosine), f"{s.calls:,}",
            )  # fmt: skip
        t.add_section()
    return t


def not_measured(summaries: Sequence[Summary]) -> list[str]:
    """One line per (format, order, reason) not measured, with the K it covers."""
    found: dict[tuple[str, str, str], list[int]] = {}
    for s in summaries:
        if s.status != "ok":
            found.setdefault((s.compressor, s.order, s.reason), []).append(s.ranks)
    return [
        f"n/a: {fmt} {order} at K = {', '.join(map(str, ks))}: {reason}"
        for (fmt, order, reason), ks in found.items()
    ]


def source_text(doc: dict[str, Any]) -> str:
    """The gradients in words: ``mlp (first 4096 of 327,880 values, batch 32)`` or a file."""
    src = doc.get("source") or {}
    if src.get("kind") == "model":
        return (f"{src['model']} gradients (first {src['numel']:,} of {src['parameters']:,} "
                f"values, batch {src['batch_size']}, synthetic data)")  # fmt: skip
    if src.get("kind") == "file":
        return f"{src['path']} ({src['rows']} rows, first {src['numel']:,} values)"
    return "unknown gradients"


def show(doc: dict[str, Any], out: Console, err: Console) -> None:
    """Print the growth and detail tables of a document, the formats not measured below them;
    its notes (defaults skipped) on ``err``."""
    for note in doc.get("notes", []):
        err.print(note, markup=False, highlight=False)
    summaries = summarize(rows(doc, "the document"))
    st = doc.get("settings", {})
    head = escape(f"{doc.get('simulated', 'simulated ranks (one process)')}; {source_text(doc)}")
    out.print(growth_table(
        summaries,
        f"numerics: relative error of the averaged gradient vs the float64 mean, median of "
        f"{st.get('repeats', '?')} repeats\n{head}",
    ))  # fmt: skip
    out.print(detail_table(
        summaries,
        "numerics at the largest K measured: median and 95 % interval over repeats; the bias "
        f"includes noise / sqrt(repeats): compare it with the noise floor\n{head}",
    ))  # fmt: skip
    for line in not_measured(summaries):
        out.print(line, markup=False, highlight=False)
    for line in order_lines(doc):
        out.print(line, markup=False, highlight=False)


def order_lines(doc: dict[str, Any]) -> list[str]:
    """What each order of the document rounds, one line each (``orders`` in the document)."""
    found = doc.get("orders") or {}
    return [f"order {name}: {text}" for name, text in found.items()]
