"""Cells and phrases of the report page (:mod:`qbench.report.page`): numbers formatted for
people, ratios with their 95 % interval and samples, configurations in words."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from qbench.records import memory
from qbench.report import intervals, names

Formatter = Callable[[Any], str]


def num(spec: str, scale: float = 1.0, unit: str = "", prefix: str = "") -> Formatter:
    def fmt(value: Any) -> str:
        return "-" if pd.isna(value) else f"{prefix}{float(value) * scale:{spec}}{unit}"

    return fmt


def text(value: Any) -> str:
    return "-" if pd.isna(value) else str(value)


dollars = num(".3g", prefix="$")  # a cost per iteration can be a millionth of a dollar


DISPLAY: dict[str, tuple[str, Formatter]] = {
    **{c: (c, text) for c in ("model", "dataset", "backend", "scheme", "compressor", "method")},
    **{"world_size": ("ranks", text), "network": ("network", text)},
    "skew": ("skew", num("g")),
    "samples_per_s": ("samples/s", num(",.1f")),
    "t_iteration_median": ("iter ms", num(".2f", 1e3)),
    "t_comm": ("comm ms", num(".2f", 1e3)),
    "bytes_per_iteration": ("MB/iter", num(".3f", 1e-6)),
    "bits_per_value": ("bits/value", num(".2f")),
    "vs_best": ("vs best (95% CI; samples)", text),
    "best_baseline": ("best uncompressed baseline", text),
    "vs_fp32": ("vs fp32 (95% CI; samples)", text),
    "baseline": ("fp32 baseline", text),
    "vs_flat_fp32": ("vs flat fp32 (95% CI; samples)", text),
    "cost_per_iteration": ("$/iter", dollars),
    "cost_per_epoch": ("$/epoch", dollars),
    "cost_to_target": ("$ to target", dollars),
    memory.RSS: ("peak RSS MiB", text),  # cells from peak_cell
    memory.GPU: ("peak GPU MiB", text),
    memory.STATE: ("state MiB", text),
}
MEMORY_NOTE = (
    "`peak RSS MiB`: the most resident memory any rank's process held during the run (model "
    "built, warm-up and measured iterations). It counts the whole process: the Python "
    "interpreter, torch and its libraries hold several hundred MiB before any model, and in a "
    "warm rank group (`isolation: group`, the local default) a run starts from what the "
    "process kept of earlier runs; a difference between runs launched alone says more than "
    "the value itself. `peak GPU MiB` (CUDA runs): the most memory the caching allocator "
    "handed to tensors at once (torch.cuda.max_memory_allocated), largest over ranks. "
    "`state MiB`: the parameters, gradients and optimizer state a rank held at the end of the "
    "run, counted tensor by tensor (under FSDP its shards), largest over ranks."
)


def describe(row: pd.Series | dict[str, Any]) -> str:
    """A configuration in words; its name keeps "(simulated)"."""
    where = f"{row['model']} / {row['dataset']}, {row['backend']}"
    ranks = f"{row['world_size']} rank{'' if row['world_size'] == 1 else 's'}"
    return f"{row['method']} on {where}, {ranks}, {row['network']}"


def interval(row: pd.Series | dict[str, Any], prefix: str) -> intervals.Interval | None:
    return intervals.of_row(row, prefix)


def ratio_cell(prefix: str) -> Callable[[dict[str, Any]], str]:
    def cell(row: dict[str, Any]) -> str:
        found = interval(row, prefix)
        if found is None:
            return num(".2f", unit="x")(row.get(prefix))
        return interval_text(found)

    return cell


def shown_peaks(frame: pd.DataFrame) -> list[str]:
    """The memory columns a table shows (``qbench.records.memory``): RSS always (``-`` where
    not recorded), the GPU's peak and the training state only where some run measured one."""
    return [memory.RSS, *(c for c in (memory.GPU, memory.STATE) if frame[c].notna().any())]


def peak_cell(row: dict[str, Any], column: str) -> str:
    """A peak in MiB, ``1,001``; ``(1/2 ranks)`` after it where fewer ranks recorded one
    than ran (a rank that died before writing it)."""
    value, ranks, world = (pd.to_numeric(row.get(c), errors="coerce")
                           for c in (column, "peak_ranks", "world_size"))  # fmt: skip
    if pd.isna(value):
        return "-"
    short = ranks < world  # False where either is unknown (NaN)
    shown = f"{value:,.0f}" if value >= 10 else f"{value:.2g}"  # a small model's state: 0.41
    return shown + (f" ({ranks:g}/{world:g} ranks)" if short else "")


def best_baseline(row: pd.Series | dict[str, Any]) -> str:
    """The configuration a row's ``speedup_vs_best`` divides by, for people ("DDP bf16",
    "allreduce · fp32"); "-" without one."""
    scheme = row.get("best_baseline")
    return "-" if pd.isna(scheme) else names.method(scheme, row.get("best_baseline_compressor"))


def compressed(configs: pd.DataFrame) -> pd.DataFrame:
    """Configurations that compress (not fp32 or a plain 16-bit cast, ``speedups.uncompressed``)
    with a speedup over their best uncompressed baseline."""
    coded = ~configs["uncompressed"].astype(bool)
    return configs[coded & configs["speedup_vs_best"].notna()]


def few_runs_warning(rows: pd.DataFrame, prefix: str, what: str) -> list[str]:
    found = [i for i in (interval(r, prefix) for r in rows.to_dict("records")) if i]
    few = sum(i.few_runs for i in found)
    if not few:
        return []
    return [
        f"{few} of these {len(found)} {what} rest on fewer than {intervals.FEW_RUNS} runs per "
        "side: their intervals only see the noise within a run. Sweep with "
        f"`repeats: {intervals.FEW_RUNS}` (or more seeds) to measure the noise between runs."
    ]


def interval_text(found: intervals.Interval | None) -> str:
    """A table cell: ``1.21x (1.17-1.24; 5/5 it)``, ``~`` first when within the noise."""
    if found is None:
        return "-"
    mark = "" if found.beyond_noise else "~"
    unit = "runs" if found.unit == intervals.RUNS else "it"
    return (
        f"{mark}{found.ratio:.2f}x ({found.low:.2f}-{found.high:.2f}; "
        f"{found.n_num}/{found.n_base} {unit})"
    )


def table(frame: pd.DataFrame, columns: list[Any]) -> pd.DataFrame:
    spec = {c: DISPLAY.get(c, (str(c), num(",.1f"))) for c in columns}
    return format_table(frame, spec)


def format_table(frame: pd.DataFrame, spec: dict[Any, tuple[str, Formatter]]) -> pd.DataFrame:
    """Strings for people: the page shows numbers, it does not compute with them."""
    return pd.DataFrame({head: frame[c].map(f).astype(str) for c, (head, f) in spec.items()})
