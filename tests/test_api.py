"""The Python API (``qbench.sweep``, ``qbench.load``, ``qbench.report``) and ``qbench init``.

The API must give the CLI's validation and one-line errors, and be typed for the user's own
type checker; ``qbench init`` must write a starter that runs as written and never overwrite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

import qbench
from qbench.cli import cli
from qbench.cli import init as init_mod
from qbench.errors import UserError
from qbench.run import workload
from qbench.spec import matrix, scenario
from tests import invoke as qbench_cli
from tests.paths import ROOT


# -- errors as the CLI gives them ----------------------------------------------------------------
def test_sweep_rejects_a_bad_mapping_with_the_clis_message(tmp_path: Path) -> None:
    with pytest.raises(UserError) as e:
        qbench.sweep({"name": "x", "model": "mlp", "iteration": 3}, out=tmp_path / "r")
    assert str(e.value).startswith(
        "<dict>: unknown key 'iteration' (did you mean 'iterations'?); valid keys: name, model"
    )
    with pytest.raises(UserError, match=r"^scenario file 'nope.yaml' not found"):
        qbench.sweep("nope.yaml")
    bad = r"^<dict>: compressor entry 1 `qsdg`: unknown compressor 'qsdg' \(did you mean 'qsgd'\?\)"
    with pytest.raises(UserError, match=bad):
        qbench.sweep({"name": "x", "model": "mlp", "compressor": "qsdg"}, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()  # nothing ran


def test_sweep_checks_factories_before_any_run(tmp_path: Path) -> None:
    spec = {"name": "x", "model": {"factory": "nopkg_api_q:build", "input_shape": (4,),
                                   "num_classes": 2}, "world_size": 1}  # fmt: skip
    with pytest.raises(UserError, match=r"^model factory 'nopkg_api_q:build' cannot be imported"):
        qbench.sweep(spec, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_load_and_report_say_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"results directory .*nothing does not exist"):
        qbench.load(tmp_path / "nothing")
    with pytest.raises(UserError, match=r"no runs found in"):
        qbench.load(tmp_path)
    with pytest.raises(UserError, match=r"results directory .*nothing does not exist"):
        qbench.report(tmp_path / "nothing")


def test_report_is_callable_and_still_the_package_in_a_fresh_process() -> None:
    code = (
        "import qbench, sys\n"
        "assert 'torch' not in sys.modules and 'pandas' not in sys.modules\n"
        "assert callable(qbench.report)\n"
        "from qbench.report import tables\n"
        "import qbench.report.stats\n"
        "assert callable(qbench.report) and qbench.report.tables is tables\n"
        "print(qbench.report.__name__, qbench.sweep.__module__, qbench.Results.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["qbench.report", "qbench.api", "Results"]


def test_the_api_is_typed_for_the_users_type_checker(tmp_path: Path) -> None:
    script = tmp_path / "use_api.py"
    script.write_text(
        "from pathlib import Path\nimport pandas as pd\nimport qbench\n"
        "out: Path = qbench.sweep({'name': 'x', 'model': 'mlp'}, out='r')\n"
        "frame: pd.DataFrame = qbench.load(out).summary\n"
        "md: Path = qbench.report(out).summary_md\n"
        "bad: int = qbench.sweep('s.yaml')\n"
    )
    # qbench is followed (silently) as a user's checker would; torch, torchvision and matplotlib,
    # which no signature of the API names, are skipped: following them was 38 s of CPU of the
    # test's 38 (10.6 s without them, fresh caches both, the machine loaded)
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nignore_missing_imports = True\nfollow_imports = silent\n" + "".join(
        f"[mypy-{m}.*]\nfollow_imports = skip\n" for m in ("torch", "torchvision", "matplotlib")
    ))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--config-file", str(config),
         "--cache-dir", str(tmp_path / "cache"), str(script)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # only the deliberate mistake
    assert 'Incompatible types in assignment (expression has type "Path"' in lines[0]


# -- qbench init ---------------------------------------------------------------------------------
def test_init_writes_a_commented_scenario_and_never_overwrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    first = CliRunner().invoke(cli, ["init"])
    assert first.exit_code == 0, first.output
    text = (tmp_path / "scenario.yaml").read_text()
    assert text.startswith("# A starter scenario from `qbench init`")
    runs = matrix.expand(scenario.loads(text)).runs
    assert sorted((r.workload.model, r.method.scheme_label, r.compressor_label) for r in runs) == [
        ("mlp", "ddp", "fp32"), ("mlp", "reduce-broadcast+backward", "qsgd-4b-b512")]  # fmt: skip
    (tmp_path / "scenario.yaml").write_text("mine")
    again = subprocess.run([sys.executable, "-m", "qbench.cli", "init"], capture_output=True,
                           text=True, cwd=tmp_path)  # fmt: skip
    assert again.returncode == 2
    assert again.stderr == (
        "qbench: error: scenario.yaml exists and qbench init never overwrites; name another "
        "file, e.g. `qbench init my-sweep.yaml`\n"
    )
    assert (tmp_path / "scenario.yaml").read_text() == "mine"


def test_init_workload_writes_factories_that_pass_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["init", "own.yaml", "--workload"])
    assert result.exit_code == 0, result.output
    assert "wrote own.yaml and workload.py" in result.output
    raw = yaml.safe_load((tmp_path / "own.yaml").read_text())
    assert raw["model"]["factory"] == "workload:build"
    assert raw["dataset"] == {"factory": "workload:data"}
    monkeypatch.delitem(sys.modules, "workload", raising=False)
    runs = matrix.expand(scenario.load(tmp_path / "own.yaml")).runs
    try:
        workload.preflight(runs)  # imports ./workload.py, builds, one forward pass and the loss
    finally:
        sys.modules.pop("workload", None)
    taken = CliRunner().invoke(cli, ["init", "other.yaml", "--workload"])
    assert taken.exit_code != 0 and "workload.py exists" in str(taken.exception)
    assert not (tmp_path / "other.yaml").exists()  # nothing written when one file is taken


def test_init_names_the_sweep_after_the_file() -> None:
    files: dict[Path, Any] = init_mod.starter(Path("dir/fast-one.yaml"), workload=False)
    assert yaml.safe_load(files[Path("dir/fast-one.yaml")])["name"] == "fast-one"


# -- end to end ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_sweep_load_report_from_python(tmp_path: Path) -> None:
    spec = {"name": "nb", "model": "logreg", "world_size": (1, 2), "warmup": 1,
            "iterations": 3, "compressor": ["none", {"name": "qsgd", "bits": 4}]}  # fmt: skip
    out = qbench.sweep(spec, out=tmp_path / "nb", progress=False)
    assert out == tmp_path / "nb"
    data = qbench.load(out)
    assert sorted(zip(data.summary["world_size"], data.summary["compressor"], strict=True)) == [
        (1, "fp32"), (1, "qsgd-4b-b512"), (2, "fp32"), (2, "qsgd-4b-b512")]  # fmt: skip
    assert (data.summary["status"] == "ok").all()
    assert len(data.iterations) == (1 + 2) * 2 * (1 + 3)  # ranks x compressors x iterations
    paths = qbench.report(out)
    assert paths.summary_md.is_file() and len(paths.summary) == 4
    again = qbench.sweep(spec, out=tmp_path / "nb", overrides={"iterations": 3}, progress=False)
    assert again == out and len(qbench.load(out).summary) == 4  # resumed: nothing new


@pytest.mark.slow
def test_the_init_workload_starter_runs_as_written(tmp_path: Path) -> None:
    def qb(*args: str) -> subprocess.CompletedProcess[str]:
        return qbench_cli.run([sys.executable, "-m", "qbench.cli", *args], capture_output=True,
                       text=True, cwd=tmp_path, timeout=900)  # fmt: skip

    assert qb("init", "--workload").returncode == 0
    run = qb("sweep", "scenario.yaml", "--out", "res")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "done: 2 ok, 0 not ok" in run.stderr
