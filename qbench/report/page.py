"""The report page, ``report/index.md`` and ``report/index.html``: seed 002's questions, each
answered by a sentence generated from the numbers, the table behind it and its figures.

Every sentence is computed from the summary (never a number written here), so the page stays
true for any results directory. The HTML file is self-contained apart from the PNG figures it
shows by relative path, so the report folder can be copied or served as it is.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from qbench.records.store import INDEX_HTML, INDEX_MD, atomic_write_bytes

CONFIG = ["model", "dataset", "backend", "scheme", "compressor", "world_size", "network", "skew"]
_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
    "color:#222;line-height:1.45}table{border-collapse:collapse;margin:.8em 0;font-size:.9em}"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
    "th{background:#f3f3f3}td{font-variant-numeric:tabular-nums;white-space:nowrap}"
    "img{max-width:100%;border:1px solid #eee}code{background:#f3f3f3;padding:0 .2em}"
    "figcaption{color:#666;font-size:.85em}"
)
Formatter = Callable[[Any], str]


def _num(spec: str, scale: float = 1.0, unit: str = "", prefix: str = "") -> Formatter:
    def fmt(value: Any) -> str:
        return "-" if pd.isna(value) else f"{prefix}{float(value) * scale:{spec}}{unit}"

    return fmt


def _text(value: Any) -> str:
    return "-" if pd.isna(value) else str(value)


_dollars = _num(".3g", prefix="$")  # a cost per iteration can be a millionth of a dollar


DISPLAY: dict[str, tuple[str, Formatter]] = {
    **{c: (c, _text) for c in ("model", "dataset", "backend", "scheme", "compressor")},
    **{"world_size": ("ranks", _text), "network": ("network", _text)},
    "skew": ("skew", _num("g")),
    "samples_per_s": ("samples/s", _num(",.1f")),
    "t_iteration_median": ("iter ms", _num(".2f", 1e3)),
    "t_comm": ("comm ms", _num(".2f", 1e3)),
    "bytes_per_iteration": ("MB/iter", _num(".3f", 1e-6)),
    "bits_per_value": ("bits/value", _num(".2f")),
    "speedup_vs_fp32": ("vs fp32", _num(".2f", unit="x")),
    "baseline": ("fp32 baseline", _text),
    "speedup_vs_flat_fp32": ("vs flat fp32", _num(".2f", unit="x")),
    "cost_per_iteration": ("$/iter", _dollars),
    "cost_per_epoch": ("$/epoch", _dollars),
    "cost_to_target": ("$ to target", _dollars),
}


@dataclass
class Section:
    """One question: its answer sentences, an already formatted table and figure names."""

    title: str
    sentences: list[str]
    table: pd.DataFrame | None = None
    figures: list[str] = field(default_factory=list)


def write_page(
    report_dir: Path, summary: pd.DataFrame, acc_table: pd.DataFrame, figures: list[Path]
) -> Path:
    """Write ``index.md`` and ``index.html`` into ``report_dir``; returns the HTML path.
    ``figures``: what the report saved (PDF copies are ignored, PNGs are shown)."""
    pngs = [p.name for p in figures if p.suffix == ".png"]
    sections = build_sections(summary, acc_table, pngs)
    title = f"qbench study: {report_dir.resolve().parent.name}"
    counts = ", ".join(f"{n} {s}" for s, n in summary["status"].value_counts().items())
    intro = f"{len(summary)} runs: {counts}. Configurations merge repeats and seeds (medians)."
    atomic_write_bytes(report_dir / INDEX_MD, to_markdown(title, intro, sections).encode())
    atomic_write_bytes(report_dir / INDEX_HTML, to_html(title, intro, sections).encode())
    return report_dir / INDEX_HTML


def build_sections(summary: pd.DataFrame, acc: pd.DataFrame, pngs: list[str]) -> list[Section]:
    """The study's questions in seed 002's order, then cost, failures and leftover figures."""
    configs = _configs(summary)
    sections = [
        _speed(configs), _accuracy(acc), _one_bit(configs, acc), _backends(configs),
        _ranks(configs), _money(configs), _failed(summary),
    ]  # fmt: skip
    homes = {"breakdown": 0, "speedup_ratio": 0, "accuracy": 1, "pareto": 1, "scalability": 4}
    extra = Section("Other figures", [])
    for name in pngs:
        home = homes.get(Path(name).stem)
        (sections[home] if home is not None else extra).figures.append(name)
    return sections + ([extra] if extra.figures else [])


def _configs(summary: pd.DataFrame) -> pd.DataFrame:
    """Ok runs with a throughput, one row per configuration (median over repeats/seeds)."""
    ok = summary[(summary["status"] == "ok") & summary["samples_per_s"].notna()]
    if ok.empty:  # no throughput at all (e.g. every row warm-up): keep the columns, no rows
        return ok
    numeric = [c for c in ok.columns if c not in CONFIG and pd.api.types.is_numeric_dtype(ok[c])]
    spec: dict[str, Any] = {c: "median" for c in numeric if c != "simulated"}
    spec.update(compressor_name="first", simulated="any")
    if "baseline" in ok:
        spec["baseline"] = "first"
    return ok.groupby(CONFIG, dropna=False, sort=True).agg(spec).reset_index()


def _describe(row: pd.Series) -> str:
    """A configuration in words; its compressor label keeps "(simulated)"."""
    where = f"{row['model']} / {row['dataset']}, {row['backend']} {row['scheme']}"
    ranks = f"{row['world_size']} rank{'' if row['world_size'] == 1 else 's'}"
    return f"{row['compressor']} on {where}, {ranks}, {row['network']}"


def _compressed(configs: pd.DataFrame) -> pd.DataFrame:
    return configs[(configs["compressor_name"] != "none") & configs["speedup_vs_fp32"].notna()]


def _speed(configs: pd.DataFrame) -> Section:
    columns = [*CONFIG[:7], "samples_per_s", "t_iteration_median", "t_comm"]
    columns += ["bytes_per_iteration", "bits_per_value", "speedup_vs_fp32", "baseline"]
    columns += ["speedup_vs_flat_fp32"]
    section = Section("Does low precision help speed?", [], _table(configs, columns))
    section.sentences.append(
        "Speedups are over the fastest fp32 configuration of the same model, ranks, backend and "
        "network (column fp32 baseline; ddp is PyTorch DDP, whose bucketed allreduce overlaps "
        "backward, the way users train); vs flat fp32 is over fp32 aggregated after backward, "
        "the baseline of the seed papers."
    )
    coded = _compressed(configs)
    if coded.empty:
        section.sentences.append("No compressed run has an fp32 run of the same setup to compare.")
        return section
    best = coded.loc[coded["speedup_vs_fp32"].idxmax()]
    worst = coded.loc[coded["speedup_vs_fp32"].idxmin()]
    faster = int((coded["speedup_vs_fp32"] > 1).sum())
    section.sentences += [
        f"{faster} of {len(coded)} compressed configurations are faster than their fp32 baseline.",
        f"Best speedup: {best['speedup_vs_fp32']:.2f}x ({_describe(best)}).",
    ]
    if len(coded) > 1:
        section.sentences.append(f"Worst: {worst['speedup_vs_fp32']:.2f}x ({_describe(worst)}).")
    if coded["simulated"].any():
        section.sentences.append(
            "Rows marked (simulated) send the compressed bytes without reducing the gradients "
            "(seed 002 section 4.4): an upper bound on speed, not a training result."
        )
    return section


def _accuracy(acc: pd.DataFrame) -> Section:
    section = Section("Does it hurt accuracy?", [])
    if acc.empty:
        section.sentences.append("No accuracy-mode runs (set `epochs:` and a real `dataset:`).")
        return section
    shown = acc.assign(top1=acc["top1_mean"] * 100, diff=acc["diff_vs_fp32"] * 100)
    section.table = _format(shown, {
        **{c: (c, _text) for c in ("model", "dataset", "scheme", "compressor", "runs")},
        "skew": ("skew", _num("g")), "bits_per_value": ("bits/value", _num(".2f")),
        "top1": ("top-1 %", _num(".2f")), "diff": ("diff vs fp32 (pt)", _num("+.2f")),
        "time_to_target_s": ("time to target (s)", _num(".2f")),
    })  # fmt: skip
    diffs = shown[(shown["compressor"] != "fp32") & shown["diff"].notna()]
    if diffs.empty:
        section.sentences.append("No compressed configuration has an fp32 run to compare with.")
        return section
    worst, best = diffs.loc[diffs["diff"].idxmin()], diffs.loc[diffs["diff"].idxmax()]
    section.sentences += [
        f"Largest change against fp32: {worst['diff']:+.2f} points of top-1 "
        f"({worst['compressor']} on {worst['model']} / {worst['dataset']}, {worst['scheme']}).",
    ]
    if len(diffs) > 1:
        section.sentences.append(
            f"Smallest: {best['diff']:+.2f} points ({best['compressor']} on {best['model']} / "
            f"{best['dataset']}, {best['scheme']})."
        )
    return section


def _one_bit(configs: pd.DataFrame, acc: pd.DataFrame) -> Section:
    """1-bit against the other compressors on the three things that matter: bytes, speed
    and accuracy; the verdict is the comparison, not a threshold chosen here."""
    section = Section("Is 1-bit worth it?", [])
    coded = _compressed(configs)
    one = coded[coded["bits"] <= 1]
    if one.empty:
        section.sentences.append("No 1-bit run (e.g. `compressor: {name: onebit}`).")
        return section
    per = coded.groupby("compressor").agg(
        speedup=("speedup_vs_fp32", "max"), bits=("bits_per_value", "median")
    )
    drops = acc[acc["compressor"] != "fp32"].groupby("compressor")["diff_vs_fp32"].min() * 100
    per = per.assign(drop=drops).reset_index()
    section.table = _format(per, {
        "compressor": ("compressor", _text), "bits": ("bits/value", _num(".2f")),
        "speedup": ("best vs fp32", _num(".2f", unit="x")),
        "drop": ("worst top-1 diff (pt)", _num("+.2f")),
    })  # fmt: skip
    is_one = per["compressor"].isin(one["compressor"])
    section.sentences.append(_one_bit_verdict(per[is_one], per[~is_one]))
    return section


def _one_bit_verdict(one: pd.DataFrame, other: pd.DataFrame) -> str:
    top = one.loc[one["speedup"].idxmax()]
    text = f"{top['compressor']} sends {top['bits']:.2f} bits per value and reaches "
    text += f"{top['speedup']:.2f}x over fp32"
    if other.empty:
        return text + "; no other compressor was run to compare with."
    rival = other.loc[other["speedup"].idxmax()]
    text += f", against {rival['speedup']:.2f}x for {rival['compressor']} "
    text += f"({rival['bits']:.2f} bits per value)"
    if pd.notna(top["drop"]) and pd.notna(rival["drop"]):
        text += f"; worst top-1 change {top['drop']:+.2f} vs {rival['drop']:+.2f} points"
    return text + "."


def _backends(configs: pd.DataFrame) -> Section:
    """Each backend's best scheme per setup, matched on everything else (seed 002: low
    precision can make MPI competitive with NCCL)."""
    keys = ["model", "dataset", "compressor", "world_size", "network", "skew"]
    best = configs.groupby([*keys, "backend"], dropna=False)["samples_per_s"].max()
    wide = best.unstack("backend")
    names = sorted(wide.columns, key=lambda b: (b != "mpi", b))
    spec = {c: DISPLAY[c] for c in keys} | {b: (f"{b} samples/s", _num(",.1f")) for b in names}
    section = Section("MPI vs NCCL/Gloo", [], _format(wide.reset_index(), spec))
    if len(names) < 2:
        only = names[0] if names else "no backend"
        section.sentences.append(f"Only {only} was measured; sweep `backend: [gloo, mpi]`.")
        return section
    for other in names[1:]:
        ratio = (wide[names[0]] / wide[other]).dropna()
        if ratio.empty:
            continue
        section.sentences.append(
            f"{names[0]} reaches a median {ratio.median():.2f}x the throughput of {other} "
            f"over {len(ratio)} matched setups ({ratio.min():.2f}x to {ratio.max():.2f}x)."
        )
    return section


def _ranks(configs: pd.DataFrame) -> Section:
    keys = ["model", "dataset", "backend", "scheme", "compressor", "network"]
    cells = configs.assign(cell=[
        "-" if pd.isna(s) else f"{s:,.1f}" + ("" if pd.isna(x) else f" ({x:.2f}x)")
        for s, x in zip(configs["samples_per_s"], configs["scalability"], strict=True)
    ])  # fmt: skip
    wide = cells.groupby([*keys, "world_size"], dropna=False)["cell"].first().unstack()
    table = wide.reset_index().fillna("-")
    table.columns = [c if isinstance(c, str) else f"{c} ranks" for c in table.columns]
    section = Section("How many ranks?", ["Cells: samples/s (speedup over 1 rank)."], table)
    scaled = configs[(configs["world_size"].fillna(0) > 1) & configs["scalability"].notna()]
    if scaled.empty:
        section.sentences.append("No multi-rank run has a 1-rank run to scale from.")
        return section
    top = scaled.loc[scaled["scalability"].idxmax()]
    linear = 100 * top["scalability"] / top["world_size"]
    section.sentences.append(
        f"Best scaling: {top['scalability']:.2f}x at {top['world_size']} ranks "
        f"({linear:.0f} % of linear; {_describe(top)})."
    )
    return section


def _money(configs: pd.DataFrame) -> Section:
    columns = ["cost_per_iteration", "cost_per_epoch", "cost_to_target"]
    priced = configs[configs[columns].notna().any(axis=1)]
    section = Section("What does it cost?", [], None)
    if priced.empty:
        section.sentences.append("No `price_per_hour` in the scenario, so no costs.")
        return section
    section.table = _table(priced, [*CONFIG[:7], *columns])
    for column, what in (("cost_to_target", "run to the target"), ("cost_per_epoch", "epoch")):
        if priced[column].notna().any():
            low = priced.loc[priced[column].idxmin()]
            section.sentences.append(f"Cheapest {what}: ${low[column]:.3g} ({_describe(low)}).")
    return section


def _failed(summary: pd.DataFrame) -> Section:
    bad = summary[summary["status"] != "ok"]
    first = bad["error"].map(lambda e: _text(e).strip().splitlines()[0] if _text(e).strip()
                             else "-")  # fmt: skip
    table = bad.assign(error=first)[["run_id", "status", "exit_code", "error"]]
    table = table.astype(object).fillna("-")
    said = f"{len(bad)} of {len(summary)} runs are not ok." if len(bad) else "All runs are ok."
    return Section("Failed runs", [said], table if len(bad) else None)


def _table(frame: pd.DataFrame, columns: list[Any]) -> pd.DataFrame:
    spec = {c: DISPLAY.get(c, (str(c), _num(",.1f"))) for c in columns}
    return _format(frame, spec)


def _format(frame: pd.DataFrame, spec: dict[Any, tuple[str, Formatter]]) -> pd.DataFrame:
    """Strings for people: the page shows numbers, it does not compute with them."""
    return pd.DataFrame({head: frame[c].map(f).astype(str) for c, (head, f) in spec.items()})


# -- rendering -------------------------------------------------------------------------------
def to_markdown(title: str, intro: str, sections: list[Section]) -> str:
    parts = [f"# {title}", intro]
    for s in sections:
        parts += [f"## {s.title}", " ".join(s.sentences)]
        if s.table is not None and not s.table.empty:
            rows = s.table.itertuples(index=False, name=None)
            parts.append(markdown_table(list(map(str, s.table.columns)), rows))
        parts += [f"![{Path(name).stem}]({name})" for name in s.figures]
    return "\n\n".join(parts) + "\n"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table; ``|`` in cells is escaped (report.py's tables use it too)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines)


def to_html(title: str, intro: str, sections: list[Section]) -> str:
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{_inline(intro)}</p>"]
    for s in sections:
        body += [f"<h2>{html.escape(s.title)}</h2>", f"<p>{_inline(' '.join(s.sentences))}</p>"]
        if s.table is not None and not s.table.empty:
            body.append(s.table.to_html(index=False, border=0, escape=True))
        for name in s.figures:
            src = html.escape(name, quote=True)
            body.append(f'<figure><img src="{src}" alt="{src}"><figcaption>{src}</figcaption>'
                        "</figure>")  # fmt: skip
    head = f'<meta charset="utf-8"><title>{html.escape(title)}</title><style>{_CSS}</style>'
    page = [f"<!DOCTYPE html>\n<html><head>{head}</head><body>", *body, "</body></html>\n"]
    return "\n".join(page)


def _inline(text: str) -> str:
    """Escaped text with `code` spans, the one piece of markdown the sentences use."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))
