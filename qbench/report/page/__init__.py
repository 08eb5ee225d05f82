"""The report page, ``report/index.md`` and ``report/index.html``: seed 002's questions, each
answered by sentences generated from the numbers, the table behind them and their figures.

Every sentence is computed from the summary (never a number written here), so the page stays
true for any results directory, and it never claims more than was measured:

* every speedup and ratio carries its 95 % interval and samples per side
  (:mod:`qbench.report.intervals`; runs when both sides repeat, iterations otherwise);
* a verdict ("compression pays here / does not") rests only on configurations whose interval
  excludes 1; the others are said to be within the noise;
* 1-rank runs communicate nothing, so they never headline a communication speedup;
* a comparison on fewer than 3 runs per side is flagged.

Configurations, methods and compressors are named for people (:mod:`qbench.report.names`).
Rendering (the self-contained HTML, provenance, links) is :mod:`qbench.report.page.render`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from qbench.records.store import INDEX_HTML, INDEX_MD, atomic_write_bytes
from qbench.report import disturbed, intervals, names, provenance
from qbench.report.page import baselines, breakeven, cells, one_bit
from qbench.report.page.render import Section, markdown_table, slug, to_html, to_markdown

DISPLAY = cells.DISPLAY

__all__ = ["DISPLAY", "Section", "build_sections", "markdown_table", "slug", "write_page"]

CONFIG = ["model", "dataset", "backend", "scheme", "compressor", "world_size", "network", "skew",
          "precision"]  # fmt: skip


def write_page(
    report_dir: Path, summary: pd.DataFrame, acc_table: pd.DataFrame, figures: list[Path],
    throughputs: intervals.Throughputs | None = None, codec: breakeven.Codec | None = None,
) -> Path:  # fmt: skip
    """Write ``index.md`` and ``index.html`` into ``report_dir``; returns the HTML path.
    ``figures``: what the report saved (PNGs are shown, PDFs linked); ``throughputs``: the
    per-iteration samples that give backend comparisons their intervals; ``codec``: the codec
    times of the break-even section (``breakeven.load``)."""
    pngs = [p.name for p in figures if p.suffix == ".png"]
    sections = build_sections(summary, acc_table, pngs, throughputs, codec)
    title = f"qbench study: {report_dir.resolve().parent.name}"
    counts = ", ".join(f"{n} {s}" for s, n in summary["status"].value_counts().items())
    intro = f"{len(summary)} runs: {counts}. Configurations merge repeats and seeds (medians)."
    replayed = int(summary["replayed"].sum())
    if replayed:  # on top, so that no section's early return can leave it out
        intro += (
            f" {replayed} runs ran with replayed compute (compute: replay): each rank slept "
            "through the forward, backward and optimizer step as measured on one rank alone (the "
            "run's timeline.json) while its real gradient went through the real exchange; their "
            "speeds are about communication at that compute time, and they trained nothing."
        )
    devices = names.codec_devices(summary)
    if devices:
        worst = summary["codec_overrun_share"].max()
        intro += (
            f" Their encode and decode lasted what the same compressors took on "
            f"{', '.join(devices)} (codec_time: a `qbench bench kernels --json` file), while "
            "the payloads were this machine's real codec's"
            + (f"; the real codec was slower than that in up to {worst:.0%} of rank-iterations,"
               " which then stand for a slower device." if worst > 0 else ".")
        )  # fmt: skip
    prov = provenance.read(report_dir.parent, summary, figures)
    atomic_write_bytes(report_dir / INDEX_MD, to_markdown(title, intro, sections).encode())
    page = to_html(title, intro, sections, report_dir, prov)
    atomic_write_bytes(report_dir / INDEX_HTML, page.encode())
    return report_dir / INDEX_HTML


def build_sections(
    summary: pd.DataFrame, acc: pd.DataFrame, pngs: list[str],
    throughputs: intervals.Throughputs | None = None, codec: breakeven.Codec | None = None,
) -> list[Section]:  # fmt: skip
    """The study's questions in seed 002's order, then cost, where each codec pays (with codec
    times), failures and leftover figures."""
    configs = _configs(summary)
    speed = _speed(configs, summary)
    sections = [
        speed, _accuracy(acc), one_bit.answer(configs, acc),
        _backends(configs, throughputs), _ranks(configs), _money(configs),
    ]  # fmt: skip
    if codec is not None and codec.times is not None:
        sections.append(breakeven.answer(configs, summary, codec))
    else:  # no codec times, no section: one line says how to get them
        speed.notes.append(breakeven.HOW if codec is None else codec.origin)
    sections.append(_failed(summary))
    homes = {"breakdown": 0, "speedup_ratio": 0, "utility": 0, "utilization": 0, "accuracy": 1,
             "pareto": 1,
             "scalability": 4}  # fmt: skip
    extra = Section("Other figures", [])
    for name in pngs:
        home = homes.get(Path(name).stem)
        (sections[home] if home is not None else extra).figures.append(name)
    return sections + ([extra] if extra.figures else [])


def _configs(summary: pd.DataFrame) -> pd.DataFrame:
    """Ok runs with a throughput, one row per configuration (median over repeats/seeds), with
    its run ids, interval columns and a name for people (``method``)."""
    ok = summary[(summary["status"] == "ok") & summary["samples_per_s"].notna()]
    ok = ok[~ok["left_out"].astype(bool)]  # disturbed: the speed section names them
    if ok.empty:  # no throughput at all (e.g. every row warm-up): keep the columns, no rows
        return ok.assign(method=pd.Series(dtype=str))
    config = [c for c in CONFIG if c in ok.columns]
    numeric = [c for c in ok.columns if c not in config and pd.api.types.is_numeric_dtype(ok[c])]
    spec: dict[str, Any] = {c: "median" for c in numeric if c not in ("simulated", "profiled")}
    spec.update(compressor_name="first", simulated="any", run_id=list)
    named = ("baseline", "best_baseline", "best_baseline_compressor", "uncompressed")
    for column in (*named, *(c for c in ok.columns if c.endswith("_unit"))):
        spec[column] = "first"
    for column in (c for c in ok.columns if c.endswith(("_low", "_high", "_n", "_n_base"))):
        spec[column] = "first"  # one interval per configuration: every row holds the same
    out = ok.groupby(config, dropna=False, sort=True).agg(spec).reset_index()
    out["method"] = [names.method(s, c) for s, c in zip(out["scheme"], out["compressor"],
                                                         strict=True)]  # fmt: skip
    return out


def _speed(configs: pd.DataFrame, summary: pd.DataFrame) -> Section:
    table = _rows_table(configs)
    section = Section("Does low precision help speed?", [], table)
    section.warnings += disturbed.warnings(summary)
    unknown = disturbed.unknown_note(summary)
    if unknown:
        section.notes.append(unknown)
    section.notes.append(
        f"{baselines.NOTE} Each carries the 95 % bootstrap "
        "interval of its configuration and the samples per side (runs when both sides were "
        "repeated, it: iterations otherwise); `~` marks a speedup whose interval includes 1: "
        "within the noise."
    )
    section.notes.append(cells.MEMORY_NOTE)
    coded = cells.compressed(configs)
    single = coded[coded["world_size"].fillna(0) <= 1]
    multi = coded[coded["world_size"].fillna(0) > 1]
    real = multi[~multi["simulated"].astype(bool)]
    if len(single):
        section.notes.append(
            f"{len(single)} compressed 1-rank configurations are left out of the verdict: one "
            "rank communicates nothing, so their speedup only measures encoding overhead and "
            "noise."
        )
    if multi["simulated"].any():
        section.notes.append(
            "Rows marked (simulated) send the compressed bytes without reducing the gradients "
            "(seed 002 section 4.4): an upper bound on speed, not a training result, so they "
            "are left out of the verdict too."
        )
    if real.empty:
        section.sentences.append(
            "No compressed multi-rank run has an uncompressed run (fp32 or a 16-bit cast) of "
            "the same setup to compare: no verdict."
        )
        return section
    section.sentences += _speed_verdict(real)
    section.sentences += baselines.sentences(real, configs)
    section.warnings += cells.few_runs_warning(real, "speedup_vs_best", "comparisons")
    return section


def _speed_verdict(multi: pd.DataFrame) -> list[str]:
    """Counts by verdict, then the verdict itself from beyond-noise configurations only."""
    rows = multi.to_dict("records")
    found = [(r, cells.interval(r, "speedup_vs_best")) for r in rows]
    faster = [(r, i) for r, i in found if i is not None and i.low > 1]
    slower = [(r, i) for r, i in found if i is not None and i.high < 1]
    noise = len(rows) - len(faster) - len(slower)
    out = [
        f"Of {len(rows)} compressed multi-rank configurations, {len(faster)} are faster than "
        f"their best uncompressed baseline beyond the noise (interval above 1), {len(slower)} "
        f"slower beyond it and {noise} within it."
    ]
    if faster:
        best, interval = max(faster, key=lambda ri: ri[1].low)
        out.append(
            f"Compression pays here for {len(faster)} of them; the surest gain is "
            f"{cells.describe(best)}: {interval.text()} over {cells.best_baseline(best)}."
        )
    elif slower and not noise:
        least, interval = max(slower, key=lambda ri: ri[1].ratio)
        out.append(
            "Compression does not pay here: every compressed configuration is slower than its "
            "best uncompressed baseline beyond the noise; the least slow is "
            f"{cells.describe(least)}: {interval.text()} over {cells.best_baseline(least)}."
        )
    else:
        out.append(
            "No verdict that compression pays: no compressed configuration is faster beyond "
            "the noise."
        )
    if slower and faster:
        worst, interval = min(slower, key=lambda ri: ri[1].high)
        out.append(f"The clearest loss is {cells.describe(worst)}: {interval.text()} over "
                   f"{cells.best_baseline(worst)}.")  # fmt: skip
    return out


def _rows_table(configs: pd.DataFrame) -> pd.DataFrame:
    shown = configs.assign(
        vs_best=[cells.ratio_cell("speedup_vs_best")(r) for r in configs.to_dict("records")],
        best_baseline=[cells.best_baseline(r) for r in configs.to_dict("records")],
        vs_fp32=[cells.ratio_cell("speedup_vs_fp32")(r) for r in configs.to_dict("records")],
        vs_flat_fp32=[cells.ratio_cell("speedup_vs_flat_fp32")(r)
                      for r in configs.to_dict("records")],
        baseline=[cells.text(b) if pd.isna(b) else names.scheme(b) for b in configs["baseline"]],
    )  # fmt: skip
    columns = ["model", "dataset", "backend", "method", "world_size", "network"]
    columns += ["samples_per_s", "t_iteration_median", "t_comm", "bytes_per_iteration"]
    columns += ["bits_per_value", "vs_best", "best_baseline", "vs_fp32", "baseline", "vs_flat_fp32"]
    shown, columns = _with_peaks(shown, columns)
    return cells.table(shown, columns)


def _with_peaks(shown: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """The peak memory per rank as cells (``cells.peak_cell``), the GPU's only where measured."""
    peaks = cells.shown_peaks(shown)
    records = shown.to_dict("records")
    shown = shown.assign(**{c: [cells.peak_cell(r, c) for r in records] for c in peaks})
    return shown, columns + peaks


def _accuracy(acc: pd.DataFrame) -> Section:
    section = Section("Does it hurt accuracy?", [])
    if acc.empty:
        section.sentences.append("No accuracy-mode runs (set `epochs:` and a real `dataset:`).")
        return section
    shown = acc.assign(
        top1=acc["top1_mean"] * 100, diff=acc["diff_vs_fp32"] * 100,
        method=[names.method(s, c) for s, c in zip(acc["scheme"], acc["compressor"], strict=True)],
    )  # fmt: skip
    section.table = cells.format_table(shown, {
        **{c: (c, cells.text) for c in ("model", "dataset", "method", "runs")},
        "skew": ("skew", cells.num("g")), "bits_per_value": ("bits/value", cells.num(".2f")),
        "top1": ("top-1 %", cells.num(".2f")), "diff": ("diff vs fp32 (pt)", cells.num("+.2f")),
        "time_to_target_s": ("time to target (s)", cells.num(".2f")),
    })  # fmt: skip
    diffs = shown[(shown["compressor"] != "fp32") & shown["diff"].notna()]
    if diffs.empty:
        section.sentences.append("No compressed configuration has an fp32 run to compare with.")
        return section
    worst, best = diffs.loc[diffs["diff"].idxmin()], diffs.loc[diffs["diff"].idxmax()]
    section.sentences += [
        f"Largest change against fp32: {worst['diff']:+.2f} points of top-1 "
        f"({worst['method']} on {worst['model']} / {worst['dataset']}, {worst['runs']} runs).",
    ]
    if len(diffs) > 1:
        section.sentences.append(
            f"Smallest: {best['diff']:+.2f} points ({best['method']} on {best['model']} / "
            f"{best['dataset']}, {best['runs']} runs)."
        )
    return section


def _backends(configs: pd.DataFrame, throughputs: intervals.Throughputs | None) -> Section:
    """Each backend's best method per setup, matched on everything else (seed 002: low
    precision can make MPI competitive with NCCL), with the interval of the ratio."""
    keys = ["model", "dataset", "compressor", "world_size", "network", "skew"]
    best = configs.loc[configs.groupby([*keys, "backend"], dropna=False)["samples_per_s"].idxmax()]
    wide = best.set_index([*keys, "backend"])["samples_per_s"].unstack("backend")
    runs = best.set_index([*keys, "backend"])["run_id"]
    names_ = sorted(wide.columns, key=lambda b: (b != "mpi", b))
    shown = wide.reset_index().assign(compressor=lambda f: f["compressor"].map(names.compressor))
    spec = {c: cells.DISPLAY[c] for c in keys}
    spec |= {b: (f"{b} samples/s", cells.num(",.1f")) for b in names_}
    section = Section("MPI vs NCCL/Gloo", [])
    if len(names_) < 2:
        section.table = cells.format_table(shown, spec)
        only = names_[0] if names_ else "no backend"
        section.sentences.append(f"Only {only} was measured; sweep `backend: [gloo, mpi]`.")
        return section
    first = names_[0]
    for other in names_[1:]:
        found: list[intervals.Interval | None] = []
        for setup, row in wide.iterrows():
            if pd.isna(row[first]) or pd.isna(row[other]) or throughputs is None:
                found.append(None)
                continue
            key = setup if isinstance(setup, tuple) else (setup,)
            found.append(throughputs.ratio(runs[(*key, first)], runs[(*key, other)]))
        column = f"{first} / {other} (95% CI; samples)"
        shown[column] = [cells.interval_text(i) for i in found]
        spec[column] = (column, cells.text)
        section.sentences += _backend_sentence(first, other, [i for i in found if i])
    section.table = cells.format_table(shown, spec)
    return section


def _backend_sentence(first: str, other: str, found: list[intervals.Interval]) -> list[str]:
    if not found:
        return [f"No setup ran on both {first} and {other}."]
    ratios = sorted(i.ratio for i in found)
    median = ratios[len(ratios) // 2] if len(ratios) % 2 else sum(
        ratios[len(ratios) // 2 - 1 : len(ratios) // 2 + 1]) / 2  # fmt: skip
    faster = sum(i.low > 1 for i in found)
    slower = sum(i.high < 1 for i in found)
    return [
        f"{first} reaches a median {median:.2f}x the throughput of {other} over {len(found)} "
        f"matched setups ({ratios[0]:.2f}x to {ratios[-1]:.2f}x); beyond the noise it is "
        f"faster in {faster} and slower in {slower}, the other {len(found) - faster - slower} "
        "are within it."
    ]


def _ranks(configs: pd.DataFrame) -> Section:
    keys = ["model", "dataset", "backend", "method", "network"]
    scale = cells.ratio_cell("scalability")
    shown = configs.assign(cell=[
        "-" if pd.isna(r["samples_per_s"]) else f"{r['samples_per_s']:,.1f}"
        + ("" if pd.isna(r["scalability"]) else f"; {scale(r)}")
        for r in configs.to_dict("records")
    ])  # fmt: skip
    wide = shown.groupby([*keys, "world_size"], dropna=False)["cell"].first().unstack()
    table = wide.reset_index().fillna("-")
    table.columns = [c if isinstance(c, str) else f"{c} ranks" for c in table.columns]
    section = Section(
        "How many ranks?",
        ["Cells: samples/s; speedup over 1 rank (95% CI; samples per side)."], table,
    )  # fmt: skip
    scaled = configs[(configs["world_size"].fillna(0) > 1) & configs["scalability"].notna()]
    if scaled.empty:
        section.sentences.append("No multi-rank run has a 1-rank run to scale from.")
        return section
    top = scaled.loc[scaled["scalability"].idxmax()]
    linear = 100 * top["scalability"] / top["world_size"]
    found = cells.interval(top, "scalability")
    value = found.text() if found is not None else f"{top['scalability']:.2f}x"
    section.sentences.append(
        f"Best scaling: {value} at {top['world_size']} ranks ({linear:.0f} % of linear; "
        f"{cells.describe(top)})."
    )
    section.warnings += cells.few_runs_warning(scaled, "scalability", "scaling ratios")
    return section


def _money(configs: pd.DataFrame) -> Section:
    columns = ["cost_per_iteration", "cost_per_epoch", "cost_to_target"]
    priced = configs[configs[columns].notna().any(axis=1)]
    section = Section("What does it cost?", [], None)
    if priced.empty:
        section.sentences.append("No `price_per_hour` in the scenario, so no costs.")
        return section
    section.table = cells.table(priced, ["model", "dataset", "backend", "method", "world_size",
                                    "network", *columns])  # fmt: skip
    for column, what in (("cost_to_target", "run to the target"), ("cost_per_epoch", "epoch")):
        if priced[column].notna().any():
            low = priced.loc[priced[column].idxmin()]
            section.sentences.append(
                f"Cheapest {what}: ${low[column]:.3g} ({cells.describe(low)})."
            )
    return section


def _failed(summary: pd.DataFrame) -> Section:
    bad = summary[~summary["status"].isin(["ok", "profiled"])]
    first = bad["error"].map(lambda e: (cells.text(e).strip().splitlines() or ["-"])[0])
    table = bad.assign(error=first)[["run_id", "status", "exit_code", "error"]]
    table = table.astype(object).fillna("-")
    said = f"{len(bad)} of {len(summary)} runs are not ok." if len(bad) else "All runs are ok."
    profiled = int((summary["status"] == "profiled").sum())
    if profiled:
        said += (
            f" {profiled} profiled runs (their traces in each run's profile/ folder) are "
            "measured but kept out of every speed comparison: the profiler slows them."
        )
    return Section("Failed runs", [said], table if len(bad) else None)
