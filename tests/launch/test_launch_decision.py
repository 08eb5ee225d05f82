"""The launch decision (qbench.launch.decision): launcher x isolation, the one check of
``isolation`` that the YAML key, ``--isolation`` and the API's ``isolation=`` share, and the
Slurm + group error. The CLI and the API call the same function; these tests call it directly
and through both doors."""

from __future__ import annotations

from pathlib import Path

import pytest

from qbench.errors import UserError
from qbench.launch import decision
from qbench.launch.launcher import Launch
from qbench.spec import matrix as matrix_mod
from qbench.spec import scenario as scenario_mod
from tests import invoke

BASE = "name: d\nmodel: mlp\nworld_size: 1\nbackend: gloo\nwarmup: 1\niterations: 2\n"
# the scenario reference's message for a bad `isolation:` (docs/scenarios.md), written out here
BAD = "isolation 'proces' is not one of auto, group, process; e.g. `isolation: auto`"


def _decide(launcher: str | None, yaml_iso: str | None, override: str | None) -> str:
    text = BASE + (f"launcher: {launcher}\n" if launcher else "")
    text += f"isolation: {yaml_iso}\n" if yaml_iso else ""
    sc = scenario_mod.loads(text, "t")
    launch = decision.launch_for(sc, None, matrix_mod.expand(sc), override)
    assert launch.grouped == (launch.effective_isolation == "group")
    return f"{launch.kind}/{launch.effective_isolation}"


# (launcher, isolation) -> what the runs get; auto is group here and process under Slurm
GRID = [
    ("local", "auto", "local/group"), ("local", "group", "local/group"),
    ("local", "process", "local/process"), ("slurm", "auto", "slurm/process"),
    ("slurm", "process", "slurm/process"),
]  # fmt: skip


@pytest.mark.parametrize(("launcher", "iso", "expected"), GRID)
def test_launcher_by_isolation(launcher: str, iso: str, expected: str) -> None:
    assert _decide(launcher, iso, None) == expected  # from the scenario's keys
    assert _decide(launcher, None, iso) == expected  # from the override
    other = "process" if iso != "process" else "auto"
    assert _decide(launcher, other, iso) == expected  # the override wins over the key


def test_defaults_are_local_and_auto() -> None:
    assert _decide(None, None, None) == "local/group"
    assert _decide("slurm", None, None) == "slurm/process"


@pytest.mark.parametrize(("yaml_iso", "override"), [("group", None), (None, "group")])
def test_group_under_slurm_is_one_line(yaml_iso: str | None, override: str | None) -> None:
    with pytest.raises(UserError) as err:
        _decide("slurm", yaml_iso, override)
    assert "\n" not in str(err.value) and "--isolation auto or process" in str(err.value)


def test_a_bad_isolation_gets_the_scenarios_message_everywhere(tmp_path: Path) -> None:
    import qbench

    with pytest.raises(UserError) as yaml_err:
        scenario_mod.loads(BASE + "isolation: proces\n", "t")
    with pytest.raises(UserError) as override_err:
        _decide(None, None, "proces")
    with pytest.raises(UserError) as api_err:
        qbench.sweep(
            {"name": "d", "model": "mlp"}, out=tmp_path / "api", isolation="proces", progress=False
        )
    assert str(yaml_err.value) == str(override_err.value) == str(api_err.value) == BAD
    (tmp_path / "s.yaml").write_text(BASE)
    argv = ["sweep", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "cli"), "--dry-run"]
    proc = invoke.qbench(*argv, "--isolation", "proces")  # `qbench` here is the package
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert BAD in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "api").exists() and not (tmp_path / "cli").exists()


# network setting -> (launcher of a local sweep's run, machine.json network's method (None:
# not recorded), its pre-flight checks); under Slurm a run is Slurm's whatever its network
RUNS = [
    ("", "Local", None, ()),
    ("world_size: 1\nnetwork: {bandwidth: 1gbit}\n", "Emulated",
     "netns + veth per node, tc tbf both directions between nodes", ("netns",)),
    ("world_size: 2\nnetwork: {nodes: 2}\n", "Emulated",
     "netns + veth per node, tc tbf both directions between nodes", ("netns",)),
]  # fmt: skip


@pytest.mark.parametrize(("net", "name", "method", "checks"), RUNS)
def test_each_run_gets_its_launcher(
    net: str, name: str, method: str | None, checks: tuple[str, ...]
) -> None:
    sc = scenario_mod.loads(BASE.replace("world_size: 1\n", "") + (net or "world_size: 1\n"), "t")
    (spec,) = matrix_mod.expand(sc).runs
    assert spec.placement.nodes == (2 if "nodes" in net else 1)  # network.nodes: the run's nodes
    local = decision.launch_for(sc, "local", matrix_mod.expand(sc))
    launcher = decision.launcher_for(local, spec)
    assert (type(launcher).__name__, launcher.name) == (name, "local")
    assert launcher.network(spec).get("method") == method
    assert launcher.needs(spec) == checks
    slurm = decision.launcher_for(Launch("slurm"), spec)
    assert (type(slurm).__name__, slurm.name, slurm.needs(spec)) == ("Slurm", "slurm", ("slurm",))
    assert slurm.network(spec) == (
        {"shaped": False}
        if spec.placement.nodes == 1
        else {
            "shaped": False,
            "setting": {"nodes": 2},
            "nodes": 2,
            "method": "the Slurm allocation's hosts and links, not emulated",
        }
    )
