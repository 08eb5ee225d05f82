"""The report page's "Where does the codec pay for itself?" (:mod:`qbench.report.page`): per
compressor of the sweep, its codec's break-even link rate B* (``qbench.spec.roofline``) beside
the link rates the sweep measured and the speedup it measured.

B* is a prediction from a ``qbench bench kernels --json`` file's encode and decode times, not a
measurement: the file ``qbench report --kernels FILE`` names, else the sweep's own
``codec_time:`` file (whose times its runs replayed). n is the gradient size the runs recorded
(``numel``). f, the share of the codec time hidden, is recorded by no run; the share of the
runs' communication hidden behind backward (``overlap_fraction``: 0 for flat schemes) stands in
for it, since a DDP hook encodes and decodes where it communicates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from qbench.errors import UserError
from qbench.records.store import ResultStore
from qbench.report import names
from qbench.report.page import cells
from qbench.report.page.render import Section
from qbench.spec.codec_times import CodecTimes

TITLE = "Where does the codec pay for itself?"
HOW = (
    "Where each codec would pay for itself (its break-even link rate): `qbench bench kernels "
    "--json FILE` on the device in question, then `qbench report DIR --kernels FILE`."
)


@dataclass(frozen=True)
class Codec:
    """What the section reads besides the summary."""

    times: CodecTimes | None
    """The kernels file's codec times; None: no file (the page says how to get one)."""
    origin: str
    """How the file was chosen, or why there is none, for people."""
    hidden: Mapping[str, float] = field(default_factory=dict)
    """Run id -> median share of its communication hidden behind backward (``hidden_shares``)."""


def load(
    root: Path, iterations: pd.DataFrame, summary: pd.DataFrame, kernels: str | Path | None
) -> Codec:
    """The codec times for the page: ``--kernels`` (an unreadable file is the user's error,
    UserError), else the sweep's own ``codec_time:`` file while it is still there."""
    hidden = hidden_shares(iterations)
    if kernels is not None:
        return Codec(CodecTimes.read(kernels, "--kernels"), "`--kernels`", hidden)
    own = _sweep_files(root, summary)
    if not own:
        return Codec(None, HOW, hidden)
    try:  # the sweep's file may have been moved or damaged since: the page still renders
        times = CodecTimes.read(own[0])
    except UserError as e:
        return Codec(None, f"No break-even link rates: {e}. {HOW}", hidden)
    more = f" (the first of the {len(own)} its runs replayed)" if len(own) > 1 else ""
    return Codec(times, f"the sweep's own `codec_time:` file{more}", hidden)


def _sweep_files(root: Path, summary: pd.DataFrame) -> list[str]:
    """The ``codec_time:`` files the runs replayed (run.json's spec keeps the path, the labels
    only the device), sorted."""
    replayed = summary.loc[summary["codec_time"].notna(), "run_id"]
    store, found = ResultStore(root), set()
    for run_id in replayed:
        record = store.read_record(str(run_id))
        spec = record.spec if record is not None and isinstance(record.spec, dict) else {}
        if spec.get("codec_time"):
            found.add(str(spec["codec_time"]))
    return sorted(found)


def hidden_shares(iterations: pd.DataFrame) -> dict[str, float]:
    """Per run, the median over measured rank-iterations of the share of communication hidden
    behind backward (``overlap_fraction``); runs that recorded none are absent."""
    measured = iterations[~iterations["warmup"].astype(bool)]
    shares = measured.groupby("run_id")["overlap_fraction"].median().dropna()
    return {str(k): float(v) for k, v in shares.items()}


@dataclass(frozen=True)
class Rate:
    """A network's link rate in Gbit/s: what the sweep measured, what its setting shapes."""

    measured: float | None
    shaped: float | None

    @property
    def used(self) -> float | None:
        """The rate a verdict compares with: the measured one where there is one."""
        return self.measured if self.measured is not None else self.shaped

    def said(self) -> str:
        shaped = "unshaped" if self.shaped is None else f"shaped {_gbit(self.shaped)} Gbit/s"
        if self.measured is None:
            return f"{shaped}, no flat fp32 run measured it"
        return f"{shaped}; the flat fp32 runs measured {_gbit(self.measured)} Gbit/s"


def rates(summary: pd.DataFrame) -> dict[str, Rate]:
    """Per network: Gbit/s a rank sent per second of communication in the flat fp32 runs
    (bytes per iteration / comm time, median over runs; DDP's comm time is only the part
    backward did not hide, so its runs are left out), and the rate its setting shapes."""
    ok = summary[(summary["status"] == "ok") & ~summary["left_out"].astype(bool)]
    flat = ok[(ok["compressor_name"] == "none") & (ok["overlap"] == "none")]
    flat = flat[(flat["world_size"].fillna(0) > 1) & (flat["t_comm"] > 0)]
    sent = flat["bytes_per_iteration"] * 8 / flat["t_comm"] / 1e9
    measured = sent.groupby(flat["network"]).median().dropna()
    rates = summary.groupby("network")["link_bits_per_s"].first() / 1e9  # NaN: unshaped
    return {str(network): Rate(_number(measured.get(network)), _number(rate))
            for network, rate in rates.items()}  # fmt: skip


def answer(configs: pd.DataFrame, summary: pd.DataFrame, codec: Codec) -> Section:
    """The table (one row per compressed configuration, grouped by compressor) and a sentence
    per network and compressor: whether its codec's time alone lets it pay there."""
    times = codec.times
    assert times is not None  # the page shows the HOW line instead
    section = Section(TITLE, [], notes=[_note(times, codec.origin)])
    coded = configs[~configs["uncompressed"].astype(bool) & ~configs["simulated"].astype(bool)]
    coded = coded[coded["world_size"].fillna(0) > 1]  # one rank sends nothing
    found, missing = _placed(coded, times, codec.hidden, rates(summary))
    if missing:
        section.sentences.append(_missing(missing, times))
    if found.empty:
        section.sentences.insert(0, "No compressed multi-rank configuration to place.")
        return section
    found = found.sort_values(["name", "network", "model", "method"], kind="stable")
    section.table = _table(found)
    for _, group in found.groupby(["network", "name", "model", "numel"], sort=False, dropna=False):
        section.sentences.append(_sentence(group))
    return section


def _placed(
    coded: pd.DataFrame, times: CodecTimes, hidden: Mapping[str, float], by_net: dict[str, Rate]
) -> tuple[pd.DataFrame, list[str]]:
    """Each configuration the file can place, with n, f, both B* and its network's rate; and
    the compressor labels it cannot (no rows, no payload size, no gradient size)."""
    rows, missing = [], []
    for r in coded.to_dict("records"):
        label = str(r["compressor"])
        try:
            wire = times.wire_bytes(label, int(r["numel"])) if times.has(label) else None
        except (UserError, ValueError, TypeError):  # a plug-in not installed; numel unknown
            wire = None
        if wire is None:
            missing.append(label)
            continue
        n, f = int(r["numel"]), _share(r["run_id"], hidden)
        rows.append({**r, "numel": n, "f": f, "name": names.compressor(label),
                     "b0": times.breakeven(label, n),
                     "bf": None if f is None else times.breakeven(label, n, min(f, 1.0)),
                     "rate": by_net.get(str(r["network"]), Rate(None, None))})  # fmt: skip
    return pd.DataFrame(rows), sorted(set(missing))


def _share(run_ids: Any, hidden: Mapping[str, float]) -> float | None:
    """The configuration's f: the median over its runs of the share they hid; None where no
    run recorded one (results from before the column)."""
    shares = [hidden[str(i)] for i in run_ids if str(i) in hidden]
    return float(pd.Series(shares).median()) if shares else None


def _table(found: pd.DataFrame) -> pd.DataFrame:
    records = found.to_dict("records")
    shown = found.assign(
        shaped=[r.shaped for r in found["rate"]],
        measured=[r.measured for r in found["rate"]],
        vs_best=[cells.ratio_cell("speedup_vs_best")(r) for r in records],
        codec=[_verdict(r["b0"], r["bf"], r["rate"].used) for r in records],
    )
    return cells.format_table(shown, {
        "name": ("compressor", cells.text), "method": ("where", cells.text),
        "model": ("model", cells.text), "numel": ("n (values)", cells.num(",.0f")),
        "world_size": ("ranks", cells.text), "network": ("network", cells.text),
        "shaped": ("shaped Gbit/s", _rate), "measured": ("measured Gbit/s", _rate),
        "b0": ("B* Gbit/s, f = 0", _cell), "f": ("f (hidden)", cells.num(".2f")),
        "bf": ("B* / (1 - f)", _cell), "codec": ("codec alone", cells.text),
        "vs_best": ("measured vs best (95% CI)", cells.text),
    })  # fmt: skip


def _verdict(b0: Any, bf: Any, rate: float | None) -> str:
    """Whether the codec's time alone lets it pay at ``rate`` (the measured one first), with
    nothing hidden (``b0``) or the runs' share hidden (``bf``)."""
    b0, bf = _number(b0), _number(bf)
    if b0 is None:
        return "never pays: its payload is no smaller than fp32's"
    if rate is None:
        return "no link rate to compare with"
    if rate < b0:
        return "the codec is not the limit"
    if bf is not None and rate < bf:
        return "pays only with that share hidden"
    return "the codec alone costs more time than the bytes it saves"


def _sentence(group: pd.DataFrame) -> str:
    """One network, compressor and model: B* with nothing hidden and what it says at the
    network's rate, B* with the largest share a configuration hid, the best measured speedup:
    ``On 1gbit (shaped 1 Gbit/s; ...), the codec of QSGD 4-bit, bucket 512 pays below 19.5
    Gbit/s for mlp's 1,048,576 values: the codec is not the limit; measured: 2.00x ...``"""
    first, rate = group.iloc[0], group.iloc[0]["rate"]
    head = f"On {first['network']} ({rate.said()}), the codec of {first['name']}"
    b0 = _number(first["b0"])
    if b0 is None:
        return f"{head} never pays: its payload is no smaller than fp32's."
    text = f"{head} pays below {_gbit(b0)} Gbit/s for {first['model']}'s {first['numel']:,} "
    text += f"values: {_verdict(b0, None, rate.used)}"
    hid = group[group["f"].fillna(0) > 0]
    if not hid.empty:  # flat schemes hide nothing (f = 0): their second rate is the first
        top = hid.loc[hid["f"].idxmax()]
        text += (f"; with {top['f']:.0%} of it hidden, as {top['method']} hid of its "
                 f"communication, below {_gbit(top['bf'])} Gbit/s: "
                 f"{_verdict(b0, top['bf'], rate.used)}")  # fmt: skip
    return text + _measured(group.loc[group["speedup_vs_best"].fillna(-1).idxmax()])


def _measured(row: pd.Series) -> str:
    found = cells.interval(row, "speedup_vs_best")
    if found is None:
        return "; no measured speedup over an uncompressed baseline to set beside it."
    return (
        f"; measured: {found.text()} over {cells.best_baseline(row)} ({row['method']}, "
        f"{row['world_size']} ranks)."
    )


def _note(times: CodecTimes, origin: str) -> str:
    return (
        f"`B*` are predictions from codec times measured on {times.device} ({origin}: "
        f"{times.source}), not measurements: below `B*`, encoding and decoding the model's n "
        "values costs less time than the bytes it saves would take at that link rate, "
        "`B* = (1 - 1/r) / (1/C_enc + 1/C_dec)` with `r = 4n / wire bytes` and `C = 4n / time`; "
        "with a share f of the codec time hidden, `B* / (1 - f)`. f is the share of "
        "communication the "
        "runs hid behind backward (0 for flat schemes), taken for the codec's. Link rates: "
        "`measured` is what a rank of the flat fp32 runs sent per second of communication "
        "(bytes per iteration / comm time), `shaped` the rate the network emulates; each "
        "verdict compares with the measured rate where there is one. The measured speedup "
        "beside it is the sweep's own, with its own codec (or the times it replayed)."
    )


def _missing(labels: list[str], times: CodecTimes) -> str:
    return (
        f"No break-even rate for {', '.join(names.compressor(x) for x in labels)}: "
        f"{times.source} has no encode and decode rows of {', '.join(labels)} (it has "
        f"{', '.join(times.labels()) or 'none'}), or the runs recorded no gradient size; "
        "measure them with `qbench bench kernels SPEC --json FILE` on that device."
    )


def _number(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _gbit(value: float) -> str:
    """``35.8``, ``0.94``, ``1,230``: three digits, never an exponent."""
    if value == float("inf"):  # all of the codec hidden: any link
        return "any"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _cell(value: Any) -> str:
    """A B* cell: ``never`` where compressing cannot pay (r <= 1)."""
    return "never" if value is None or pd.isna(value) else _gbit(float(value))


def _rate(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else _gbit(float(value))
