"""How a figure's series look: one (colour, marker) pair per series, the one place that picks them.

A report's configurations, each a (scheme, compressor, compute precision) as the summary labels
them, are put in one order (fp32 first, then by compressor name, more bits first) and the i-th
takes the i-th pair of ``PAIRS``. Every figure of the report reads that order from the same
summary, so a configuration looks the same in the accuracy, Pareto, scalability, speedup and
utility figures. The first ``len(COLORS)`` pairs differ in colour and in marker (a greyscale
print still tells them apart); later ones reuse colours with other markers.

Within one figure, entries of one configuration that differ by something else (a speedup line
per backend and ranks) keep its colour and take the next free marker (``assign``): no two
entries of a legend share a pair, up to ``len(PAIRS)`` entries. Line style and hollow markers
add meaning on top (simulated runs, decentralized schemes), never identity.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import pandas as pd

COLORS = (
    *("#000000", "#1F77B4", "#D62728", "#2CA02C", "#FF7F0E"),
    *("#9467BD", "#8C564B", "#E377C2", "#17BECF", "#BCBD22"),
)
"""Black (the first configuration: fp32 where there is one), then matplotlib's tab10 without its
grey, which reference lines (ideal scaling, the Pareto front, 1x) use."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
PAIRS = tuple(
    (COLORS[i % len(COLORS)], MARKERS[(i + i // len(COLORS)) % len(MARKERS)])
    for i in range(len(COLORS) * len(MARKERS))
)
"""100 distinct pairs: pair i has colour i mod 10 and marker (i + i div 10) mod 10."""

Key = tuple[str, str, str]
"""(scheme, compressor, compute precision) as the summary labels them."""


class Style(NamedTuple):
    color: str
    marker: str


def key(scheme: object, compressor: object, precision: object = "fp32") -> Key:
    """A configuration's key; a missing precision is fp32 (results written before it)."""
    return (str(scheme), str(compressor), "fp32" if pd.isna(precision) else str(precision))


def order(summary: pd.DataFrame) -> dict[Key, int]:
    """Each configuration of the summary, any status, to its place in the report's order (a
    frame without ``compressor_name``, ``bits`` or ``precision`` is ordered without them)."""
    keys = [key(*k) for k in zip(summary["scheme"], summary["compressor"],
                                 _column(summary, "precision", "fp32"), strict=True)]  # fmt: skip
    name = _column(summary, "compressor_name", "").astype(str)
    bits = pd.to_numeric(_column(summary, "bits", 0.0), errors="coerce").fillna(0.0)
    rows = pd.DataFrame({"compressed": (name != "none").to_numpy(), "name": name.to_numpy(),
                         "bits": -bits.to_numpy(), "key": keys})  # fmt: skip
    ranked = rows.sort_values(["compressed", "name", "bits", "key"], kind="stable")
    return {k: i for i, k in enumerate(dict.fromkeys(ranked["key"]))}


def _column(summary: pd.DataFrame, name: str, default: object) -> pd.Series:
    return summary[name] if name in summary else pd.Series(default, index=summary.index)


def assign(entries: Iterable[tuple[str, Key]], summary: pd.DataFrame) -> dict[str, Style]:
    """Legend label -> its style, for one figure's entries (label, configuration) in drawing
    order. The first entry of a configuration takes the configuration's pair; a later one its
    colour with the first marker no entry took, else the first free pair. Beyond
    ``len(PAIRS)`` entries pairs repeat (no legend that long is readable anyway)."""
    places = order(summary)
    styles: dict[str, Style] = {}
    later: list[tuple[str, Key]] = []
    for label, k in entries:
        if label in styles:
            continue
        pair = PAIRS[places[k] % len(PAIRS)] if k in places else None
        if pair is None or Style(*pair) in styles.values():
            later.append((label, k))
            styles[label] = Style("", "")  # keeps the label's place; filled below
        else:
            styles[label] = Style(*pair)
    for label, k in later:
        taken = set(styles.values())
        free = [Style(*p) for p in PAIRS if Style(*p) not in taken]
        color = PAIRS[places[k] % len(PAIRS)][0] if k in places else None
        styles[label] = next((s for s in free if s.color == color), None) or (
            free[0] if free else Style(*PAIRS[len(styles) % len(PAIRS)]))  # fmt: skip
    return styles
