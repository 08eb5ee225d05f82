"""The report page as files: ``index.md`` (figures by relative path, for a repository) and
``index.html``, one self-contained file that reads offline and prints.

The HTML embeds every figure (PNG as a data URI, with a link to its PDF beside it), opens with a
table of contents and a provenance block (commit, versions, machine, scenario, when), and ends
with links to ``summary.csv``, the PDFs and each run's ``run.json`` (relative links: they work
while the report folder sits in its results directory). No script, no font, no stylesheet is
fetched; print CSS keeps figures and tables whole on a page.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
    "color:#222;line-height:1.45}table{border-collapse:collapse;margin:.8em 0;font-size:.9em}"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}"
    "th{background:#f3f3f3}td{font-variant-numeric:tabular-nums}"
    "img{max-width:100%;height:auto;border:1px solid #eee}code{background:#f3f3f3;padding:0 .2em}"
    "figure{margin:1em 0}figcaption{color:#666;font-size:.85em}"
    ".warn{background:#fff4e5;border-left:4px solid #e69500;padding:.4em .8em}"
    ".note{color:#555;font-size:.9em}"
    "nav.toc ol{columns:2}dl.prov{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em}"
    "dl.prov dt{font-weight:600}dl.prov dd{margin:0}pre{background:#f7f7f7;padding:.6em;"
    "overflow-x:auto;font-size:.85em}.scroll{overflow-x:auto}"
    "@media print{body{max-width:none;margin:0;font-size:10pt}a{color:inherit;"
    "text-decoration:none}figure,table,pre,dl{break-inside:avoid}h2{break-after:avoid}"
    ".scroll{overflow:visible}}@page{margin:1.5cm}"
)


@dataclass
class Section:
    """One question: its answer sentences, an already formatted table and figure names.
    ``warnings``: sentences the page sets apart (e.g. too few runs to trust a difference)."""

    title: str
    sentences: list[str]
    table: pd.DataFrame | None = None
    figures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """How to read the answer (baselines, intervals), shown after it in a smaller type."""


@dataclass(frozen=True)
class ProvenanceSection:
    """The page's provenance section: where the results came from, as the results directory
    records it (the sweep's own machine facts are ``qbench.launch.runfiles.Provenance``)."""

    facts: list[tuple[str, str]]
    """(what, value) rows: commit, versions, machine, scenario name, when."""
    scenario: str = ""
    """The scenario as run (``scenario.yaml``), shown verbatim."""
    links: list[tuple[str, str]] = field(default_factory=list)
    """(label, relative href) of the files beside the page: CSV, markdown, PDFs."""
    runs: list[tuple[str, str, str]] = field(default_factory=list)
    """(run id, status, relative href of its run.json)."""


# -- markdown --------------------------------------------------------------------------------
def to_markdown(title: str, intro: str, sections: list[Section]) -> str:
    parts = [f"# {title}", intro]
    for s in sections:
        parts += [f"## {s.title}", " ".join(s.sentences)]
        parts += [f"> **Warning:** {w}" for w in s.warnings]
        parts += [f"*{' '.join(s.notes)}*"] if s.notes else []
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


# -- HTML ------------------------------------------------------------------------------------
def slug(title: str) -> str:
    """An HTML id for a heading: lower case words joined by ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"


def to_html(
    title: str, intro: str, sections: list[Section], report_dir: Path, prov: ProvenanceSection
) -> str:
    """The whole page; figures are read from ``report_dir`` and embedded."""
    toc = [(slug(s.title), s.title) for s in sections]
    toc += [("provenance", "Provenance"), ("files", "Files and runs")]
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{_inline(intro)}</p>", _toc(toc)]
    for s in sections:
        body += [f'<h2 id="{slug(s.title)}">{html.escape(s.title)}</h2>',
                 f"<p>{_inline(' '.join(s.sentences))}</p>"]  # fmt: skip
        body += [f'<p class="warn"><strong>Warning:</strong> {_inline(w)}</p>' for w in s.warnings]
        body += [f'<p class="note">{_inline(" ".join(s.notes))}</p>'] if s.notes else []
        if s.table is not None and not s.table.empty:
            table = s.table.to_html(index=False, border=0, escape=True)
            body.append(f'<div class="scroll">{table}</div>')
        body += [_figure(report_dir, name) for name in s.figures]
    body += _provenance(prov)
    head = (
        '<meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
    )
    page = [
        f'<!DOCTYPE html>\n<html lang="en"><head>{head}</head><body>',
        *body,
        "</body></html>\n",
    ]
    return "\n".join(page)


def _toc(entries: list[tuple[str, str]]) -> str:
    items = "".join(f'<li><a href="#{i}">{html.escape(t)}</a></li>' for i, t in entries)
    return f'<nav class="toc"><h2 id="contents">Contents</h2><ol>{items}</ol></nav>'


def _figure(report_dir: Path, name: str) -> str:
    """A figure embedded as a data URI (the page is one file), its PDF linked when present."""
    path = report_dir / name
    alt = html.escape(f"figure {Path(name).stem}", quote=True)
    if not path.is_file():
        return f"<p>Figure {html.escape(name)} is missing from {html.escape(str(report_dir))}.</p>"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    pdf = path.with_suffix(".pdf")
    link = f' · <a href="{html.escape(pdf.name, quote=True)}">PDF</a>' if pdf.is_file() else ""
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{alt}">'
        f"<figcaption>{html.escape(Path(name).stem)}{link}</figcaption></figure>"
    )


def _provenance(prov: ProvenanceSection) -> list[str]:
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in prov.facts)
    out = ['<h2 id="provenance">Provenance</h2>', f'<dl class="prov">{rows}</dl>']
    if prov.scenario:
        out += ["<h3>Scenario as run</h3>", f"<pre>{html.escape(prov.scenario)}</pre>"]
    out.append('<h2 id="files">Files and runs</h2>')
    links = " · ".join(
        f'<a href="{html.escape(href, quote=True)}">{html.escape(label)}</a>'
        for label, href in prov.links
    )
    out.append(f"<p>{links}</p>" if links else "<p>No other files.</p>")
    if prov.runs:
        cells = "".join(
            f'<tr><td><a href="{html.escape(href, quote=True)}">{html.escape(run)}</a></td>'
            f"<td>{html.escape(status)}</td></tr>"
            for run, status, href in prov.runs
        )
        out.append(
            '<div class="scroll"><table><thead><tr><th>run (its run.json)</th><th>status</th>'
            f"</tr></thead><tbody>{cells}</tbody></table></div>"
        )
    return out


def _inline(text: str) -> str:
    """Escaped text with `code` spans, the one piece of markdown the sentences use."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))
