"""Where a results directory came from, for the report page: commit, versions, machine,
scenario and when, as ``sweep.json``, ``scenario.yaml`` and the runs' ``run.json`` recorded
them (pytest-benchmark's idea: provenance with every result). Files only; a file that is missing
or unreadable says so instead of failing the report.
"""

from __future__ import annotations

import datetime
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from qbench.records import store as paths
from qbench.records.store import ResultStore
from qbench.report.page.render import ProvenanceSection

_VERSION_ORDER = ("python", "torch", "numpy", "pandas", "nccl", "mpi4py", "mpi", "cupy")


def read(root: Path, summary: pd.DataFrame, figures: list[Path]) -> ProvenanceSection:
    """The provenance block and the links of the page in ``root/report/``."""
    store = ResultStore(root)
    sweep = _json(store.sweep_path())
    record = _first_record(store, summary)
    facts = [("results", str(Path(root).resolve()))]
    facts.append(("commit", _commits(summary, sweep, record)))
    facts.append(("qbench", f"{_qbench_version()} (report written {_now()})"))
    versions = sweep.get("versions") or record.get("versions") or {}
    facts.append(("versions", _versions(versions)))
    machine = sweep.get("machine") or record.get("machine") or {}
    facts += _machine(machine)
    scenario = _text(store.scenario_path())
    facts.append(("scenario", _scenario_name(scenario)))
    if sweep.get("written"):
        facts.append(("swept", str(sweep["written"])))
    return ProvenanceSection(facts, scenario, _links(store, figures), _runs(summary))


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _first_record(store: ResultStore, summary: pd.DataFrame) -> dict[str, Any]:
    """The first readable run.json (for results without sweep.json, e.g. copied runs)."""
    for run_id in summary["run_id"].astype(str):
        doc = _json(store.run_dir(run_id) / paths.RUN_JSON)
        if doc:
            return doc
    return {}


def _commits(summary: pd.DataFrame, sweep: dict[str, Any], record: dict[str, Any]) -> str:
    found = summary["git_commit"].dropna().astype(str).unique() if "git_commit" in summary else []
    commits = sorted(found) or [c for c in (sweep.get("git_commit"), record.get("git_commit")) if c]
    if not commits:
        return "unknown (qbench did not run from a git checkout)"
    if len(commits) == 1:
        return str(commits[0])
    return f"{len(commits)} commits: {', '.join(map(str, commits))} (runs from several sweeps)"


def _qbench_version() -> str:
    try:
        return metadata.version("qbench")
    except metadata.PackageNotFoundError:
        return "unknown"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _versions(versions: dict[str, Any]) -> str:
    keys = [k for k in _VERSION_ORDER if k in versions] + sorted(
        k for k in versions if k not in _VERSION_ORDER
    )
    shown = [f"{k} {versions[k]}" for k in keys if versions[k] not in (None, "")]
    return " · ".join(shown) or "not recorded"


def _machine(machine: dict[str, Any]) -> list[tuple[str, str]]:
    if not machine:
        return [("machine", "not recorded")]
    parts = [str(machine.get("cpu") or "unknown CPU")]
    if machine.get("cores"):
        parts.append(f"{machine['cores']} cores")
    if machine.get("memory_gib"):
        parts.append(f"{machine['memory_gib']} GiB")
    where = f"{machine.get('hostname', '?')}: {', '.join(parts)}; {machine.get('platform', '')}"
    gpus = machine.get("gpus") or {}
    devices = [d.get("name", "?") for d in gpus.get("devices", []) if isinstance(d, dict)]
    if devices:
        gpu = f"{len(devices)} x {devices[0]}" + (f", driver {gpus['driver']}" if gpus.get(
            "driver") else "")  # fmt: skip
    else:
        gpu = f"none ({gpus.get('unavailable', 'not recorded')})"
    return [("machine", where.rstrip("; ")), ("GPUs", gpu)]


def _scenario_name(text: str) -> str:
    if not text:
        return "not recorded (no scenario.yaml)"
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return "scenario.yaml is not valid YAML"
    name = doc.get("name") if isinstance(doc, dict) else None
    first = text.splitlines()[0] if text.startswith("#") else ""
    return f"{name}" + (f" ({first.lstrip('# ')})" if first else "")


def _links(store: ResultStore, figures: list[Path]) -> list[tuple[str, str]]:
    report = store.report_dir()
    files = [paths.SUMMARY_CSV, paths.SUMMARY_MD, paths.ACCURACY_CSV, paths.COMPARE_MD]
    out = [(name, name) for name in files if (report / name).is_file()]
    out.append((paths.INDEX_MD, paths.INDEX_MD))
    out += [(p.name, p.name) for p in figures if p.suffix == ".pdf"]
    for name in (paths.SCENARIO_YAML, paths.SCENARIO_RESOLVED, paths.MACHINE_JSON):
        if (store.root / name).is_file():
            out.append((name, f"../{name}"))
    return out


def _runs(summary: pd.DataFrame) -> list[tuple[str, str, str]]:
    out = []
    for run_id, status in zip(summary["run_id"].astype(str), summary["status"], strict=True):
        note = f"{status} (traces in {paths.PROFILE}/)" if status == "profiled" else str(status)
        out.append((run_id, note, f"../{run_id}/{paths.RUN_JSON}"))
    return out
