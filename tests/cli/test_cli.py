"""The command line as users meet it: bad input is one line and exit 2; sweep + report work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pandas as pd
import pytest

from qbench.cli import cli
from qbench.cli.tools import LazyGroup
from qbench.records.schema import ITERATION_COLUMNS
from tests.invoke import qbench


def process(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m qbench.cli ARGS`` as a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "qbench.cli", *args], capture_output=True, text=True, timeout=600
    )


def write(tmp: Path, text: str) -> str:
    p = tmp / "s.yaml"
    p.write_text(text)
    return str(p)


BAD = {
    "unknown key": ("name: x\nmodel: mlp\nbogus: 1\n", "unknown key 'bogus'"),
    "bad bits": ("name: x\nmodel: mlp\ncompressor: [{name: qsgd, bits: 12}]\n", "bits"),
    "unknown model": ("name: x\nmodel: alexnot\n", "unknown model 'alexnot'"),
    "malformed yaml": ("name: x\nmodel: [mlp\n", "not valid YAML"),
    "wrong type": ("name: x\nmodel: mlp\nwarmup: many\n", "warmup must be int"),
    "nodes on one host": (
        "name: x\nmodel: mlp\nworld_size: 2\nnodes: 2\n",
        "nodes: 2 needs a multi-node launcher; use --launcher slurm",
    ),
    "bad filter": ("name: x\nmodel: mlp\nexclude: [{rank: 1}]\n", "unknown axis 'rank'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_scenario_is_one_line_exit_2(case: str, tmp_path: Path) -> None:
    text, needle = BAD[case]
    proc = qbench("sweep", write(tmp_path, text), "--dry-run")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


def test_missing_file_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = qbench("sweep", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not found" in proc.stderr


# The two tests of the command as a process (the others run it in this process, tests/invoke.py):
# it starts, and a user's mistake is one line and exit 2 as a terminal shows it, no traceback.
def test_python_m_qbench_cli_starts() -> None:
    proc = process("--help")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("Usage: python -m qbench.cli [OPTIONS] COMMAND")
    assert "sweep" in proc.stdout and "report" in proc.stdout


def test_bad_option_is_one_line_exit_2() -> None:
    proc = process("report", "x", "--format", "xml")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "xml" in proc.stderr
    assert "(see `qbench report --help`)" in proc.stderr and "Traceback" not in proc.stderr


def test_cost_group_and_its_old_name(tmp_path: Path) -> None:
    """``qbench cost`` is the cost model; ``qbench model`` still runs it (hidden from --help),
    after one line on stderr, with the same exit code."""
    missing = str(tmp_path / "none.json")
    new = qbench("cost", "predict", missing)
    assert new.returncode == 2 and new.stderr.count("\n") == 1 and "not found" in new.stderr
    old = qbench("model", "predict", missing)
    lines = old.stderr.splitlines()
    assert old.returncode == 2 and len(lines) == 2, old.stderr
    assert "moved to `qbench cost`" in lines[0] and lines[1] == new.stderr.strip()
    listed = qbench("--help").stdout.splitlines()
    commands = [line.split()[0] for line in listed if line.startswith("  ") and line.strip()]
    assert "cost" in commands and "models" in commands and "model" not in commands
    sub = qbench("model", "--help")
    assert sub.returncode == 0 and "predict" in sub.stdout and "moved" in sub.stderr


def test_lazy_groups_list_each_command_with_its_own_help() -> None:
    """``qbench --help`` and ``qbench bench --help`` list their commands from ``Lazy`` entries,
    importing none: each entry's help is what click makes of the command's own docstring."""
    bench = cli.get_command(click.Context(cli), "bench")
    for group in (cli, bench):
        assert isinstance(group, LazyGroup)
        for name, lazy in group.lazy.items():
            command = group.get_command(click.Context(group), name)
            assert command is not None and command.hidden == lazy.hidden, name
            listed = click.Command(name, help=lazy.help)
            for limit in (45, 80, 1000):
                assert listed.get_short_help_str(limit) == command.get_short_help_str(limit), name


def test_dry_run_lists_runs_and_exclusions(tmp_path: Path) -> None:
    text = "name: x\nmodel: mlp\nworld_size: 2\nscheme: [allreduce]\ncompressor: [none, onebit]\n"
    proc = qbench("sweep", write(tmp_path, text), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "mlp-gloo-allreduce-fp32-w2" in proc.stdout
    assert "excluded" in proc.stdout and "cannot sum packed onebit" in proc.stdout
    assert not (tmp_path / "results").exists()


def test_dry_run_lists_async_ps_under_replay_as_excluded(tmp_path: Path) -> None:
    """The asynchronous server's loop has no replayed compute: listed with the reason, not run
    under a replay label."""
    text = ("name: x\nmodel: mlp\nworld_size: 2\ncompute: [fp32, replay]\n"
            "scheme: async-ps\ncompressor: {name: qsgd, bits: 4}\n")  # fmt: skip
    proc = qbench("sweep", write(tmp_path, text), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "mlp-gloo-async-ps-qsgd-4b-b512-w2-" in proc.stdout and "-replay-" not in proc.stdout
    assert "1 excluded" in proc.stdout
    assert "compute replay: async-ps runs a loop of its own" in proc.stdout


def test_report_on_missing_dir_is_one_line(tmp_path: Path) -> None:
    proc = qbench("report", str(tmp_path / "none"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


TINY = """
name: tiny
model: mlp
world_size: [1, 2]
backend: [gloo, mpi]
compressor: [none, {name: qsgd, bits: 4, bucket_size: 512}]
warmup: 1
iterations: 3
"""


@pytest.mark.slow
def test_sweep_then_report_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "res"
    proc = process("sweep", write(tmp_path, TINY), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run_dirs = sorted(p.parent for p in out.glob("*/run.json"))
    assert len(run_dirs) == 2 * 2 * 2
    for d in run_dirs:
        rec = json.loads((d / "run.json").read_text())
        assert rec["status"] == "ok", rec
        frame = pd.read_parquet(d / "iterations.parquet")
        assert list(frame.columns) == list(ITERATION_COLUMNS)
        assert len(frame) == rec["labels"]["world_size"] * 4
        assert frame.loc[~frame.warmup, "t_iteration"].gt(0).all()
        assert rec["machine"]["cores"] >= 1 and "torch" in rec["versions"]
        machine = json.loads((d / "machine.json").read_text())
        assert machine["hostname"] and machine["network"] == {"shaped": False}
        assert "mpi" in machine["versions"] and "gpus" in machine
        assert [h["rank"] for h in machine["ranks"]] == list(range(rec["labels"]["world_size"]))
        assert machine["hostnames"] == [machine["hostname"]]
    # Provenance of the sweep: the scenario as given and as resolved, the machine.
    assert (out / "scenario.yaml").read_text() == TINY
    resolved = json.loads((out / "scenario.resolved.json").read_text())
    assert resolved["scenario"]["iterations"] == 3 and resolved["scenario"]["lr"] == 0.05
    assert resolved["launcher"] == "local" and len(resolved["runs"]) == 8
    assert json.loads((out / "machine.json").read_text())["cores"] >= 1
    # Re-running skips what is complete (in this process from here: the start is tested above).
    again = qbench("sweep", write(tmp_path, TINY), "--out", str(out))
    assert again.returncode == 0 and "8 already done" in again.stderr
    rep = qbench("report", str(out), "--format", "csv")
    assert rep.returncode == 0, rep.stderr
    summary = pd.read_csv(out / "report" / "summary.csv")
    assert len(summary) == 8
    assert (summary["status"] == "ok").all()
    q = summary[summary["compressor"].str.startswith("qsgd")]
    assert (q["compression_ratio"] > 6).all()  # 4-bit levels + one fp32 per 512 values
    for fig in ("breakdown.png", "scalability.png", "breakdown.pdf"):
        assert (out / "report" / fig).stat().st_size > 1000
