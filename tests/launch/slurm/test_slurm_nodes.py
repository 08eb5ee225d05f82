"""Slurm across emulated nodes (issue 33): one slurmd per network namespace, each with its own
hostname (tests/slurm_cluster.py ``running_nodes_cluster``), and ``launcher: slurm`` with
``network: {nodes: 2}`` running for real: sbatch allocates both nodes, srun (gloo) or mpirun
inside the allocation (mpi) starts two ranks on each, and the records are those of any run,
with each rank's host in ``parts/host-<rank>.json``. Needs root and ``make slurm``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import invoke
from tests.slurm_cluster import Cluster, running_nodes_cluster

SCENARIO = """
name: slurmnodes
model: mlp
world_size: 4
backend: [gloo, mpi]
launcher: slurm
network: {nodes: 2}
warmup: 1
iterations: 3
"""


@pytest.fixture(scope="module")
def nodes_cluster() -> Iterator[Cluster]:
    with running_nodes_cluster(2) as cluster:
        yield cluster


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.mpi
def test_a_sweep_runs_across_two_slurm_nodes(nodes_cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SCENARIO)
    out = tmp_path / "out"
    proc = invoke.run(
        [sys.executable, "-m", "qbench.cli", "sweep", str(tmp_path / "s.yaml"), "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=nodes_cluster.env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:] + nodes_cluster.log_tails()
    runs = sorted(p.parent for p in out.glob("*/run.json"))
    assert [json.loads((r / "run.json").read_text())["status"] for r in runs] == ["ok", "ok"]
    for run in runs:
        hosts = [json.loads((run / "parts" / f"host-{k}.json").read_text())["hostname"]
                 for k in range(4)]  # fmt: skip
        assert hosts == ["qbnode0", "qbnode0", "qbnode1", "qbnode1"], run.name  # block placement
        assert f"-w4n2-{run.name[-10:]}" in run.name
        network = json.loads((run / "machine.json").read_text())["network"]
        assert network["nodes"] == 2 and not network["shaped"]
        assert network["method"] == "the Slurm allocation's hosts and links, not emulated"
    report = invoke.run([sys.executable, "-m", "qbench.cli", "report", str(out), "--format",
                             "csv"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert report.returncode == 0, report.stderr[-2000:]
