"""A rank that dies fails the run quickly, naming the rank; it never hangs the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qbench.launch.local import failed_rank
from tests import invoke

TORCHRUN_REPORT = """
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_03:44:29
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 21062)
"""
MPIRUN_REPORT = """prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:
   Process name: [prterun-vm-21157@1,2]
   Exit code:    3
"""
MPI_ABORT_REPORT = """MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD
  Proc: [[7151,1],3]
  Errorcode: 1
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (TORCHRUN_REPORT, (1, 3)),
        (MPIRUN_REPORT, (2, 3)),
        (MPI_ABORT_REPORT, (3, 1)),
        ("Traceback ...\nValueError: x\n", None),
    ],
)
def test_failed_rank_parses_launcher_reports(text: str, expected: tuple[int, int] | None) -> None:
    assert failed_rank(text) == expected


SCENARIO = """
name: faults
model: mlp
world_size: [2]
backend: [gloo, mpi]
compressor: [{name: qsgd, bits: 4}]
warmup: 1
iterations: 6
timeout: 120
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "isolation"), [("exit", "group"), ("raise", "group"), ("exit", "process")]
)
def test_dead_rank_fails_fast_and_is_named(mode: str, isolation: str, tmp_path: Path) -> None:
    """Process isolation names the rank from torchrun's and mpirun's reports; a gloo rank
    group from the exit the driver saw itself, an MPI one from mpirun's report."""
    (tmp_path / "s.yaml").write_text(SCENARIO)
    env = {**os.environ, "QBENCH_FAULT": f"1:3:{mode}"}
    t0 = time.monotonic()
    argv = ["sweep", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "r"), "--isolation",
            isolation]  # fmt: skip
    proc = invoke.run(
        [sys.executable, "-m", "qbench.cli", *argv], capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - t0 < 100  # well inside the 120 s per-run timeout: nothing hung
    records = [json.loads(p.read_text()) for p in (tmp_path / "r").glob("*/run.json")]
    assert len(records) == 2
    for rec in records:
        assert rec["status"] == "failed"
        assert rec["error"].startswith("rank 1 of 2 exited"), rec["error"]
        if mode == "raise":
            assert "RuntimeError: injected fault at iteration 3" in rec["error"]
        else:
            assert "no Python exception" in rec["error"]
        assert rec["stderr_tail"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_interrupted_sweep_leaves_no_rank_behind(backend: str, tmp_path: Path) -> None:
    """SIGTERM to the driver marks the run interrupted and ends every rank (torchrun starts its
    workers in sessions of their own, out of reach of a process-group kill)."""
    text = SCENARIO.replace("backend: [gloo, mpi]", f"backend: [{backend}]").replace(
        "iterations: 6", "iterations: 100000"
    )
    (tmp_path / "s.yaml").write_text(text)
    argv = ["sweep", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "r")]
    driver = subprocess.Popen([sys.executable, "-m", "qbench.cli", *argv], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "r").glob("*/stdout.log")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(8)  # ranks are up and training
    driver.terminate()
    driver.wait(timeout=60)
    time.sleep(1)
    (rec,) = [json.loads(p.read_text()) for p in (tmp_path / "r").glob("*/run.json")]
    assert rec["status"] == "interrupted"
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"ranks left running: {left.stdout}"


def _one_spec(tmp_path: Path) -> Path:
    from qbench.spec import matrix, scenario

    text = SCENARIO.replace("backend: [gloo, mpi]", "backend: [gloo]")
    spec = matrix.expand(scenario.loads(text, "t")).runs[0]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec.to_dict()))
    return path


def test_a_rank_that_cannot_join_tags_its_exception(tmp_path: Path) -> None:
    """A failure before any run (here joining the group: a rendezvous torch does not know)
    prints the same tagged line as one inside a run, so run.json quotes the exception instead
    of guessing "no Python exception: crashed or killed"."""
    from qbench.comm import INIT_METHOD_ENV

    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2",
           INIT_METHOD_ENV: "nowhere://store"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "qbench.run.worker", str(_one_spec(tmp_path))],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    tagged = [line for line in proc.stderr.splitlines() if " failed: " in line]
    assert len(tagged) == 1 and tagged[0].startswith("qbench worker rank 1 failed: "), proc.stderr
    assert "nowhere://" in tagged[0]  # the exception's own message
    assert "Traceback (most recent call last)" in proc.stderr  # and the traceback, as before


@pytest.mark.parametrize(
    ("env", "expected"),
    [({"RANK": "3", "OMPI_COMM_WORLD_RANK": "5"}, "3"), ({"OMPI_COMM_WORLD_RANK": "5"}, "5"),
     ({"PMIX_RANK": "6", "PMI_RANK": "7"}, "6"), ({"PMI_RANK": "7"}, "7"), ({}, "?")],
)  # fmt: skip
def test_the_rank_before_the_communicator_exists_comes_from_the_launcher(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qbench.run import worker

    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert worker._launcher_rank() == expected
