"""Issue 47's accuracy study read out: the training loss of local SGD, DiLoCo and Streaming
DiLoCo against tokens (scenarios/paper/diloco.yaml, loopback), and against wall time on a slow
link, where each inner step takes the mean step time the same method measured on that link in
scenarios/paper/diloco-links.yaml (replayed compute, real exchanges). The second x axis is
that product, a hybrid: losses from one sweep, step times from the other, said on the figure.

Per method (runs that differ only by seed): the loss of each step, the mean over ranks, smoothed
over 25 steps; its mean over seeds with a 95 % t-interval (3 seeds: t = 4.30); the final loss
(mean of the last 30 steps) the same way, and its difference to DDP's seed by seed (paired: a
seed fixes the initial model and the batches) with the t-interval of that difference; bytes
each rank sent per inner step.

    .venv/bin/python benchmarks/diloco_study.py results/diloco results/diloco-links \\
        --link 100mbit --out docs/results/diloco-loss.png
"""

from __future__ import annotations

import argparse
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from qbench.report import names, stats
from qbench.report.plots.utility import rate_label
from qbench.spec import network

SMOOTH, LAST = 25, 30
T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78}  # two-sided 95 % t quantiles by sample size
CONTEXT = 64  # the GPT's tokens per sample (qbench.catalog.models, seq_len)


def _losses(root: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per run and step: mean loss over ranks and bytes sent; the ok runs' labels, with
    ``method``, the name people read)."""
    results = stats.load(root)
    runs = results.runs[results.runs["status"] == "ok"].copy()
    with names.using(results.names):
        pairs = zip(runs["scheme"], runs["compressor"], strict=True)
        runs["method"] = [names.method(s, c) for s, c in pairs]
    it = results.iterations[results.iterations["run_id"].isin(runs["run_id"])]
    per = it.groupby(["run_id", "iteration"], as_index=False).agg(
        loss=("loss", "mean"), sent=("bytes_sent", "mean")
    )
    return per, runs


def _interval(values: pd.Series) -> tuple[float, float]:
    n = values.count()
    half = T95.get(int(n), 2.0) * values.std() / math.sqrt(n) if n > 1 else math.nan
    return float(values.mean()), float(half)


def step_times(links: str, link: str) -> dict[str, float]:
    """Method -> mean seconds per inner step on ``link`` (rounds as the report takes them)."""
    results = stats.load(links)
    per_it = stats.per_iteration(results.iterations)
    runs = results.runs[(results.runs["status"] == "ok") & (results.runs["network"] == link)]
    mean = per_it.groupby("run_id")["t_iteration"].mean()
    with names.using(results.names):
        return {names.method(r.scheme, r.compressor): float(mean[r.run_id])
                for r in runs.itertuples()}  # fmt: skip


def study(root: str, seconds: dict[str, float]) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    per, runs = _losses(root)
    rows, curves, finals = [], {}, {}
    per = per.merge(runs[["run_id", "method", "seed", "batch_size", "world_size"]])
    for label, group in per.groupby("method", sort=False):
        group = group.sort_values(["run_id", "iteration"])
        group["smooth"] = group.groupby("run_id")["loss"].transform(
            lambda s: s.rolling(SMOOTH, min_periods=1).mean()
        )
        wide = group.pivot(index="iteration", columns="seed", values="smooth")
        n = wide.shape[1]
        curve = pd.DataFrame({"mean": wide.mean(axis=1)})
        curve["half"] = T95.get(n, 2.0) * wide.std(axis=1) / math.sqrt(n) if n > 1 else 0.0
        first = group.iloc[0]
        curve["tokens"] = (curve.index + 1) * int(first["batch_size"]) * int(first["world_size"])
        curve["tokens"] *= CONTEXT
        curves[label] = curve
        last = group.groupby("seed").apply(
            lambda g: g.nlargest(LAST, "iteration")["loss"].mean(), include_groups=False
        )
        finals[label] = last
        final, half = _interval(last)
        step = seconds.get(label, math.nan)
        rows.append({
            "method": label, "seeds": n, "final loss": final, "95 % CI": half,
            "bytes/step": group["sent"].mean(), "steps": int(group["iteration"].max()) + 1,
            "s/step on the link": step,
        })  # fmt: skip
    table = pd.DataFrame(rows)
    # against DDP seed by seed (the same seed: the same initial model and batches), so the
    # interval is of the difference, not of two spreads
    ddp = next((v for k, v in finals.items() if k.startswith("DDP")), None)
    paired = [_interval(finals[m] - ddp) if ddp is not None else (math.nan, math.nan)
              for m in table["method"]]  # fmt: skip
    table["vs DDP"] = [d for d, _ in paired]
    table["vs DDP 95 % CI"] = [h for _, h in paired]
    table["wall s on the link"] = table["steps"] * table["s/step on the link"]
    return table, curves


COMMON = (", outer lr 0.7, momentum 0.9 Nesterov, via reduce-broadcast", ", delay 1, alpha 0.5")
"""Settings every DiLoCo line shares, said once in the title instead of in each name."""
COLOURS = {"DDP": "black", "H 1,": "tab:red", "H 10,": "tab:orange", "Streaming": "tab:green",
           "H 50,": "tab:blue"}  # fmt: skip
DASHES = {"MXFP4": "--", "QSGD": ":"}


def _look(label: str) -> tuple[str, str, str]:
    """(short name, colour by scheme and H, line style by the outer gradients' format)."""
    short = label
    for common in COMMON:
        short = short.replace(common, "")
    colour = next((c for key, c in COLOURS.items() if key in label), "0.5")
    style = next((d for key, d in DASHES.items() if key in label), "-")
    return short.replace("QSGD 2-bit, bucket 128, error feedback", "QSGD 2-bit + EF"), colour, style


def figure(curves: dict[str, pd.DataFrame], seconds: dict[str, float], link: str, out: str) -> None:
    bps = network.option(link).bits_per_s
    link = link if bps is None else rate_label(bps)
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 6.5), sharey=True, layout="constrained")
    for label, c in curves.items():
        short, colour, style = _look(label)
        a.plot(c["tokens"], c["mean"], label=short, color=colour, linestyle=style, linewidth=1.2)
        a.fill_between(c["tokens"], c["mean"] - c["half"], c["mean"] + c["half"],
                       color=colour, alpha=0.08)  # fmt: skip
        if label in seconds:
            wall = (c.index + 1) * seconds[label]
            b.plot(wall, c["mean"], color=colour, linestyle=style, linewidth=1.2)
    a.set_ylim(2.0, 4.5)
    a.set_xlabel("tokens (all ranks)")
    a.set_ylabel(f"training loss ({SMOOTH}-step mean; band: 95 % CI over 3 seeds)")
    a.set_title("loss at equal tokens (loopback)")
    b.set_xscale("log")
    b.set_xlabel(f"seconds: steps x the method's mean step time at {link} (replayed compute)")
    b.set_title(f"against wall time on an emulated {link} link")
    fig.suptitle("GPT on fortunes, 4 gloo ranks; DiLoCo: outer SGD lr 0.7, Nesterov 0.9, "
                 "reduce-broadcast; Streaming: delay 1, alpha 0.5")  # fmt: skip
    fig.legend(loc="outside lower center", ncols=3, fontsize=8)
    fig.savefig(out, dpi=120)


def catch_up(table: pd.DataFrame, curves: dict[str, pd.DataFrame]) -> list[str]:
    """Per method timed on the link: when DDP's seed-mean curve (smoothed as drawn) first
    reaches the method's final loss, in DDP's seconds on the link, against the method's own
    wall time; no interval: both rest on seed means."""
    timed = table.dropna(subset=["wall s on the link"]).set_index("method")
    ddp = next((m for m in timed.index if m.startswith("DDP")), None)
    if ddp is None:
        return []
    step, curve, out = timed.loc[ddp, "s/step on the link"], curves[ddp]["mean"], []
    for method, row in timed.drop(index=ddp).iterrows():
        target = float(row["final loss"])
        reached = curve[curve <= target]
        name = _look(str(method))[0]
        if reached.empty:
            out.append(f"{name}: DDP never reaches its final loss {target:.3f}")
            continue
        ddp_s = (int(reached.index[0]) + 1) * step
        wall = float(row["wall s on the link"])
        out.append(f"{name}: DDP reaches its final loss {target:.3f} after {ddp_s:.0f} s, "
                   f"{ddp_s / wall:.1f}x its {wall:.1f} s")  # fmt: skip
    return out


def markdown(table: pd.DataFrame) -> str:
    """The table as markdown (no tabulate in the venv): losses to 3 decimals, the rest as
    counts or seconds."""

    def cell(col: str, v: object) -> str:
        if isinstance(v, float) and math.isnan(v):
            return "-"
        if col in ("final loss", "95 % CI", "vs DDP", "vs DDP 95 % CI"):
            return f"{v:+.3f}" if col == "vs DDP" else f"{v:.3f}"
        if col in ("bytes/step", "steps", "seeds"):
            return f"{v:,.0f}"
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    for row in table.itertuples(index=False):
        lines.append(
            "| " + " | ".join(cell(c, v) for c, v in zip(table.columns, row, strict=True)) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study")
    parser.add_argument("links")
    parser.add_argument("--link", default="100mbit")
    parser.add_argument("--out", default="diloco-loss.png")
    args = parser.parse_args()
    seconds = step_times(args.links, args.link)
    table, curves = study(args.study, seconds)
    figure(curves, seconds, args.link, args.out)
    print(markdown(table))
    print("\n".join(catch_up(table, curves)))
    print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
