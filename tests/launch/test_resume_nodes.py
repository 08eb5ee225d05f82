"""Never lose data across emulated nodes (issue 33): a sweep of two emulated nodes whose driver
is SIGKILLed mid-run keeps its finished run, leaves no process behind, and the resumed sweep
removes the dead driver's namespaces and redoes the run that was cut off."""

from __future__ import annotations

import signal
from pathlib import Path

import pandas as pd
import pytest

from qbench.errors import UserError
from tests.launch.test_resume import (
    _assert_nothing_left,
    _start,
    _statuses,
    _sweep,
    _wait,
    _workers,
)

SCENARIO = """\
name: resume-nodes
model: mlp
world_size: 2
network: {nodes: 2, inter: 1gbit}
backend: gloo
compressor: [none, {name: qsgd, bits: 4}]
warmup: 1
iterations: 3
timeout: 300
"""


@pytest.mark.slow
def test_a_killed_sweep_across_emulated_nodes_resumes(tmp_path: Path) -> None:
    from qbench.launch import netns

    try:
        netns.check_available()
    except UserError as e:
        pytest.skip(f"emulated nodes need network namespaces: {e}")
    scenario, out = tmp_path / "s.yaml", tmp_path / "out"
    scenario.write_text(SCENARIO)
    # the group's second run (index 1) hangs at rank 0, so the kill surely finds it running
    driver = _start(scenario, out, env={"QBENCH_FAULT": "0:1:hang@1"})

    def second_run_training() -> bool:
        statuses = sorted(_statuses(out).values())
        return statuses == ["ok", "running"] and len(_workers(driver)) == 2

    try:
        _wait("the second run's two ranks", second_run_training, driver)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    mine = f"qb-{driver.pid}-"
    assert [n for n in netns.list_namespaces() if n.startswith(mine)], "no namespace was made"
    (cut,) = [k for k, s in _statuses(out).items() if s == "running"]
    _assert_nothing_left(tmp_path)  # the ranks in the nodes died with the driver

    proc = _sweep(scenario, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 runs (1 already done)" in proc.stdout + proc.stderr
    assert set(_statuses(out).values()) == {"ok"}
    rows = pd.read_parquet(out / cut / "iterations.parquet")
    assert len(rows) == 2 * 4 and rows["loss"].notna().all()  # both ranks, warmup + 3
    # the resumed sweep's stale sweep removed what the killed driver's nodes left
    assert [n for n in netns.list_namespaces() if n.startswith(mine)] == []
    _assert_nothing_left(tmp_path)
