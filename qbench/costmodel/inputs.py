"""Reading the model's inputs: ``qbench bench comm --json`` and ``qbench bench kernels --json``
documents, and sweep results directories (``run_table``: one row per ok run, medians over its
measured iterations with ``qbench.report.stats``' conventions). Files only: nothing is measured
here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from qbench import catalog
from qbench.costmodel.schemes import Scheme, nominal_bits_per_value
from qbench.errors import UserError
from qbench.records.store import MACHINE_JSON, ResultStore
from qbench.records.view import RunSpecs, run_specs
from qbench.spec import codec_times, network
from qbench.spec.network import Link

COMM_SCHEMA = "qbench.bench.comm/1"


KERNELS_SCHEMA = codec_times.SCHEMA


def bench_key(row: dict[str, Any]) -> str:
    """Identity of a bench comm row (to tell fitted rows from held-out ones): its configuration
    and measured time, so the same measurement matches whatever path its file is read from."""
    return (
        f"bench:{row['backend']}/{row['network']}/w{row['world_size']}/{row['scheme']}/"
        f"{row['compressor']}/{row['bytes']}/{float(row['time_s']):.9g}"
    )


def run_key(run_id: str) -> str:
    return f"run:{run_id}"


def comm_rows(doc: Any, source: str) -> list[dict[str, Any]]:
    """The rows of a ``qbench bench comm --json`` document (UserError if it is not one)."""
    need = ("backend", "world_size", "network", "scheme", "compressor", "bytes", "time_s")
    return codec_times.bench_rows(doc, source, COMM_SCHEMA, "qbench bench comm", need)


def kernel_rows(doc: Any, source: str) -> list[dict[str, Any]]:
    """The rows of a ``qbench bench kernels --json`` document (UserError if it is not one)."""
    return codec_times.rows(doc, source)


def float_or_nan(v: Any) -> float:
    return math.nan if v is None else float(v)


def integer_row(row: dict[str, Any]) -> bool:
    """A bench comm row of integer-allreduce, whose ``bits_per_value`` is its integer payload
    (8 bits and more), not the compressor's. Bench JSON names schemes by label only."""
    return str(row["scheme"]).startswith("integer-")


def bench_scheme(row: dict[str, Any]) -> Scheme:
    """A bench comm row's scheme: bench JSON names it by label only, read back by the catalog
    (UserError for a scheme the catalog or the model does not know)."""
    return Scheme.of(catalog.scheme_from_label(str(row["scheme"])))


def bench_compressor(row: dict[str, Any]) -> catalog.CompressorSpec:
    """A bench comm row's compressor: bench JSON names it by label only, read back by the
    catalog (UserError for a label no entry makes, e.g. a plug-in's not loaded here)."""
    return catalog.from_label(str(row["compressor"]))


def bench_link(row: dict[str, Any]) -> Link:
    """A bench comm row's link: bench JSON names it by its ``--bandwidth`` option only."""
    return network.option(str(row["network"]))


def row_bits(row: dict[str, Any]) -> float:
    """Wire bits per value of a bench comm row's compressor (integer rows: its nominal bits)."""
    try:
        nominal = nominal_bits_per_value(bench_compressor(row))
    except UserError:
        nominal = None
    bpv = row.get("bits_per_value")
    if bpv is None or (nominal is not None and integer_row(row)):
        return nominal or 32.0
    return float(bpv)


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise UserError(f"{path}: file not found; check the path")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None


def load_input(path: Path | str) -> tuple[str, Any]:
    """("runs", path) for a results directory, ("comm" | "kernels", parsed JSON) for a file."""
    p = Path(path)
    if p.is_dir():
        return "runs", p
    doc = read_json(p)
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema == COMM_SCHEMA:
        return "comm", doc
    if schema == KERNELS_SCHEMA:
        return "kernels", doc
    raise UserError(
        f"{p}: neither a results directory nor a `qbench bench comm|kernels --json` file "
        f"(schema {schema!r})"
    )


RUN_PARTS = ("t_compute", "t_encode", "t_comm", "t_decode", "t_step")


def run_table(root: Path | str) -> pd.DataFrame:
    """One row per ok run of a results directory: labels and medians over measured iterations
    (``qbench.report.stats`` conventions: iteration = max over ranks, parts = means over ranks), and
    ``source``, the directory, where a run's other files are; ``link``, its
    ``qbench.spec.network.Link`` from the recorded setting; ``specs``, the run's compressor
    and scheme as the catalog's typed values (``qbench.records.view``; None for a compressor or
    scheme this qbench does not know), which is where parameters are read, not the labels."""
    from qbench.report import stats

    results = stats.load(root)
    runs = results.runs[results.runs["status"] == "ok"]
    if runs.empty or results.iterations.empty:
        return pd.DataFrame()
    per_it = stats.per_iteration(results.iterations)
    cols = ["t_iteration", *RUN_PARTS, "bytes_sent", "payload_bytes", "grad_bytes"]
    med = per_it.groupby("run_id")[cols].median().reset_index()
    table = runs.merge(med, on="run_id", how="inner")
    table = table.merge(_forward(results.iterations), on="run_id", how="left")
    if "device" not in table.columns:
        table["device"] = None
    table["device"] = [
        d if isinstance(d, str) and d else ("cuda" if b == "nccl" else "cpu")
        for d, b in zip(table["device"], table["backend"], strict=True)
    ]
    table["workload"] = [_workload(m, p) for m, p in _pairs(table, "model", "model_params")]
    table["source"] = str(root)
    store = ResultStore(root)
    records = [_record(store, str(i)) for i in table["run_id"]]
    table["specs"] = [_specs(r) for r in records]
    table["link"] = [_link(r, str(n)) for r, n in zip(records, table["network"], strict=True)]
    ks = table["world_size"]
    table["topology"] = [_topology(r, int(k)) for r, k in zip(records, ks, strict=True)]
    table["shape"] = [t.shape if t else "" for t in table["topology"]]  # --hold-out shape=2x2
    table["emulated"] = [_emulated(Path(root) / str(i)) for i in table["run_id"]]
    return table.reset_index(drop=True)


def _topology(record: dict[str, Any] | None, world_size: int) -> network.Topology | None:
    """The run's nodes and links when its network setting has ``nodes`` (two levels, even with
    one node: its ranks share the node's loopback); None for one level (flat star, unshaped),
    which the model keeps timing on ``link`` alone."""
    net = ((record or {}).get("spec") or {}).get("network")
    if not isinstance(net, dict) or "nodes" not in net:
        return None
    return network.topology(net, world_size)


def _emulated(run_dir: Path) -> bool:
    """Whether the run's nodes were network namespaces of one host (its machine.json says how
    the network was made), not hosts of their own."""
    try:
        doc = json.loads((run_dir / MACHINE_JSON).read_text())
    except (OSError, ValueError):
        return False
    net = doc.get("network") if isinstance(doc, dict) else None
    return isinstance(net, dict) and str(net.get("method", "")).startswith("netns")


def _record(store: ResultStore, run_id: str) -> dict[str, Any] | None:
    record = store.read_record(run_id)
    return None if record is None else record.to_dict()


def _specs(record: dict[str, Any] | None) -> RunSpecs | None:
    try:
        return None if record is None else run_specs(record)
    except UserError:  # a plug-in's compressor or scheme, not loaded here
        return None


def _link(record: dict[str, Any] | None, label: str) -> Link:
    """The run's link from the network setting its spec recorded; a record without one
    (hand-written, truncated) by its network option as labelled."""
    spec = (record or {}).get("spec") or {}
    return network.link(spec["network"]) if "network" in spec else network.option(label)


def compressor_name(r: Any) -> str | None:
    """The catalog name of a ``run_table`` row's compressor (None: unknown here)."""
    specs = getattr(r, "specs", None)
    return None if specs is None else specs.compressor.name


def scheme_name(r: Any) -> str | None:
    """The catalog name of a ``run_table`` row's scheme (None: unknown here)."""
    specs = getattr(r, "specs", None)
    return None if specs is None else specs.scheme.name


def run_scheme(r: Any) -> Scheme | None:
    """A ``run_table`` row's scheme as the model sees it, from its recorded spec (None: a
    scheme this qbench or the model does not know)."""
    specs = getattr(r, "specs", None)
    try:
        return None if specs is None else Scheme.of(specs.scheme)
    except UserError:
        return None


def _forward(iterations: pd.DataFrame) -> pd.DataFrame:
    """run_id, t_forward: DDP runs' forward pass (mean over ranks, median over measured
    iterations); NaN for flat runs, whose t_compute holds forward and backward together."""
    measured = iterations[~iterations["warmup"].astype(bool)]
    mean = measured.groupby(["run_id", "iteration"])["t_forward"].mean()
    return mean.groupby("run_id").median().reset_index()


def _pairs(table: pd.DataFrame, a: str, b: str) -> Iterable[tuple[Any, Any]]:
    right = table[b] if b in table.columns else pd.Series([None] * len(table), index=table.index)
    return zip(table[a], right, strict=True)


def _workload(model: Any, params: Any) -> str:
    """``resnet20``, or ``synthetic(gflops=0.01,params=4000000)`` with model parameters."""
    given = {k: v for k, v in params.items() if v is not None} if isinstance(params, dict) else {}
    if given:
        return f"{model}(" + ",".join(f"{k}={v}" for k, v in sorted(given.items())) + ")"
    return str(model)


def held_out(table: pd.DataFrame, hold_out: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """``table`` without the runs that match any (label, value) of ``hold_out``."""
    if table.empty or not hold_out:
        return table
    keep = pd.Series(True, index=table.index)
    for key, value in hold_out:
        if key not in table.columns:
            raise UserError(
                f"--hold-out {key}={value}: no run label {key!r}; use one of world_size, "
                "network, shape (nodes x ranks per node, e.g. 2x2), backend, scheme, "
                "compressor, model, batch_size"
            )
        keep &= table[key].astype(str) != value
    return table[keep].reset_index(drop=True)


def int_or_none(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)
