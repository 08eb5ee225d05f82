"""Pre-flight: a sweep checks what every run needs before starting any, says each missing
prerequisite once with its fix (exit 2, nothing started), shows the verdicts per run in
--dry-run, and with --skip-unavailable records those runs as skipped, never as failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from qbench.catalog import datasets, toolchain
from qbench.data.idx import write_idx
from qbench.launch import preflight
from qbench.spec import matrix, scenario
from tests import invoke
from tests.invoke import qbench

FASHION_FIX = (
    "install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist, or make "
    "data), or set QBENCH_DATA=/path containing fashion-mnist/ with them"
)


def _runs(text: str) -> list[matrix.RunSpec]:
    return matrix.expand(scenario.loads(text)).runs


def _probe(**env: str) -> preflight.Probe:
    base = {k: v for k, v in os.environ.items() if k not in ("QBENCH_DATA", "CC")}
    return preflight.Probe({**base, **env})


def _write_idx_dir(root: Path, n_train: int = 64, n_test: int = 16) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), np.uint8))
        write_idx(root / f"{prefix}-labels-idx1-ubyte", (np.arange(n) % 10).astype(np.uint8))


# ---- the facts: one place for where datasets live and what they read ------------------------


def test_dataset_files_are_looked_for_without_reading_them(tmp_path: Path) -> None:
    root = tmp_path / "fashion-mnist"
    assert datasets.missing("fashion-mnist", root) == (f"no train-images-idx3-ubyte[.gz] in {root}")
    _write_idx_dir(root)
    (root / "t10k-labels-idx1-ubyte").unlink()
    assert datasets.missing("fashion-mnist", root) == f"no t10k-labels-idx1-ubyte[.gz] in {root}"
    (root / "t10k-labels-idx1-ubyte.gz").write_bytes(b"")  # looked for, never read
    assert datasets.missing("fashion-mnist", root) is None
    assert datasets.missing("cifar10", tmp_path) == f"no cifar-10-batches-py/ in {tmp_path}"
    assert datasets.missing("imagenet", tmp_path) == f"no train/ in {tmp_path}"
    assert datasets.missing("digits") is None  # scikit-learn is a dependency
    assert datasets.missing("synthetic") is None


def test_the_loader_and_the_preflight_say_the_same(tmp_path: Path) -> None:
    """qbench.data.real reads the facts the pre-flight checks: the same file, the same fix."""
    from qbench.data import real
    from qbench.errors import UserError

    with pytest.raises(UserError) as err:
        real.load("fashion-mnist", tmp_path)
    gap = datasets.missing("fashion-mnist", tmp_path)
    assert str(err.value) == f"dataset fashion-mnist: {gap}; {FASHION_FIX}"


# ---- each check ----------------------------------------------------------------------------

FASHION = "name: f\nmodel: logreg\ndataset: [digits, fashion-mnist]\nworld_size: 2\nepochs: 1\n"


def test_missing_dataset_is_one_line_with_its_fix(tmp_path: Path) -> None:
    runs = _runs(FASHION.replace("world_size: 2", "world_size: [1, 2]"))
    v = preflight.check(runs, probe=_probe(QBENCH_DATA=str(tmp_path)))
    unavailable = v.unavailable()
    dataset = {r.run_id: r.workload.dataset for r in runs}
    assert len(runs) == 4 and [dataset[r] for r in unavailable] == ["fashion-mnist"] * 2
    (m,) = v.missing()  # two runs need it: said once
    root = tmp_path / "fashion-mnist"
    assert m.line() == f"dataset fashion-mnist: no train-images-idx3-ubyte[.gz] in {root}; " + (
        FASHION_FIX
    )
    assert m.kind == "install" and m.make == "data" and m.tag == "fashion-mnist files"
    _write_idx_dir(root)
    assert preflight.check(runs, probe=_probe(QBENCH_DATA=str(tmp_path))).missing() == []


def test_mpi_needs_mpirun_and_mpi4py(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runs = _runs("name: m\nmodel: mlp\nbackend: [gloo, mpi]\nworld_size: 2\n")
    assert preflight.check(runs, probe=_probe()).missing() == []  # pip installs both
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    v = preflight.check(runs, probe=_probe())
    (m,) = v.missing()
    assert m.what == "backend mpi: mpirun not found" and m.tag == "mpirun"
    assert [r.split("-")[1] for r in v.unavailable()] == ["mpi"]


def test_emulated_links_need_root(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _runs("name: n\nmodel: mlp\nworld_size: 2\nnetwork: [unshaped, {bandwidth: 1gbit}]\n")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    v = preflight.check(runs, probe=_probe())
    (m,) = v.missing()
    assert m.kind == "privilege" and m.tag == "root"
    assert m.fix == "run the sweep as root, or drop the links with --set network=unshaped"
    assert len(v.unavailable()) == 1 and "unshaped" not in v.reason(v.unavailable()[0])


def test_cuda_runs_without_gpus_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _runs(
        "name: g\nmodel: mlp\nbackend: [nccl, gloo]\nworld_size: [1, 2]\ngpus_per_node: 2\n"
    )
    monkeypatch.setattr(preflight.Probe, "_cuda_facts", lambda self: (0, False, False, "no NVML"))
    v = preflight.check(runs, probe=_probe())
    (m,) = v.missing()  # w1 and w2 need different counts, but there is no GPU at all: one line
    assert m.what == "CUDA ranks: no GPU here (no NVML)" and m.kind == "hardware"
    assert sorted(r.split("-")[1] for r in v.unavailable()) == ["nccl", "nccl"]


def test_gloo_ranks_on_cuda_need_one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "name: g\nmodel: mlp\nbackend: gloo\ndevice: cuda\nscheme: ddp\nworld_size: 2\n"
    runs = _runs(text)
    monkeypatch.setattr(preflight.Probe, "_cuda_facts", lambda self: (1, True, False, ""))
    assert preflight.check(runs, probe=_probe()).missing() == []  # they share it
    monkeypatch.setattr(preflight.Probe, "_cuda_facts", lambda self: (0, True, False, "no NVML"))
    (m,) = preflight.check(runs, probe=_probe()).missing()
    assert m.what == "CUDA ranks: no GPU here (no NVML)"


def test_cuda_counts_gpus_and_asks_for_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _runs("name: g\nmodel: mlp\nbackend: nccl\nworld_size: [1, 2]\n")
    monkeypatch.setattr(preflight.Probe, "_cuda_facts", lambda self: (1, True, True, ""))
    v = preflight.check(runs, probe=_probe())
    (m,) = v.missing()
    assert m.what == "CUDA ranks: 2 GPUs needed (one per rank), found 1"
    assert [r.rsplit("-", 2)[1] for r in v.unavailable()] == ["w2"]
    monkeypatch.setattr(preflight.Probe, "_cuda_facts", lambda self: (2, True, False, ""))
    (m,) = preflight.check(runs, probe=_probe()).missing()
    assert m.what == "backend nccl: this torch has no NCCL" and m.tag == "NCCL"


def test_compiled_codecs_need_a_c_compiler(tmp_path: Path) -> None:
    runs = _runs("name: c\nmodel: mlp\nworld_size: 2\ncompressor: [none, fp16, {name: qsgd}]\n")
    no_cc = {"PATH": str(tmp_path), "CC": ""}
    v = preflight.check(runs, probe=_probe(**no_cc))
    (m,) = v.missing()
    assert m.tag == "C compiler" and m.fix == toolchain.FIX
    name = {r.run_id: r.method.compressor.given["name"] for r in runs}
    assert [name[r] for r in v.unavailable()] == ["qsgd"]  # fp32 and fp16: no kernels
    assert (
        preflight.check(runs, probe=_probe(**no_cc, QBENCH_COMPRESS_BACKEND="torch")).missing()
        == []
    )


def test_compressors_inside_scheme_parameters_count() -> None:
    assert toolchain.uses_compiled(
        [{"name": "none"}], "async-ps", {"down": {"name": "qsgd", "bits": 8}}
    )
    assert not toolchain.uses_compiled([{"name": "topk"}], "allreduce", {"overlap": 2})
    assert toolchain.uses_compiled([{"name": "none"}], "integer-allreduce", {})


def test_disk_space_is_checked_for_the_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs = _runs("name: d\nmodel: mlp\nworld_size: [1, 2]\n")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: usage(0, 0, 100 * 2**20))
    v = preflight.check(runs, out=tmp_path / "a" / "b", probe=_probe())
    (m,) = v.missing()
    assert m.kind == "space"
    assert m.what == f"disk: 100 MiB free under {tmp_path}, 264 MiB needed for 2 runs"  # 256 + 2*4
    assert len(v.unavailable()) == 2


def test_the_refusal_lists_each_prerequisite_once(tmp_path: Path) -> None:
    runs = _runs(FASHION.replace("logreg", "[logreg, mlp]"))
    v = preflight.check(runs, probe=_probe(QBENCH_DATA=str(tmp_path)))
    lines = str(v.error()).splitlines()
    assert lines[0] == (
        "2 runs cannot start on this machine; nothing was started. Install what is missing, "
        "or pass --skip-unavailable to run the others:"
    )
    assert len(lines) == 2 and lines[1].startswith("  dataset fashion-mnist: no train-images")


# ---- the command line ----------------------------------------------------------------------


def _process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m qbench.cli ARGS``, for the sweep that launches ranks."""
    return invoke.run(
        [sys.executable, "-m", "qbench.cli", *args], capture_output=True, text=True,
        timeout=600, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_sweep_stops_before_starting_anything(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(FASHION)
    out = tmp_path / "out"
    env = {"QBENCH_DATA": str(tmp_path / "nothing")}
    proc = qbench("sweep", str(tmp_path / "s.yaml"), "--out", str(out), env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("qbench: error: 1 run cannot start on this machine; nothing")
    assert lines[1] == (
        f"  dataset fashion-mnist: no train-images-idx3-ubyte[.gz] in "
        f"{tmp_path / 'nothing' / 'fashion-mnist'}; {FASHION_FIX}"
    )
    assert len(lines) == 2 and "Traceback" not in proc.stderr
    assert not out.exists() or not list(out.glob("*/run.json"))  # nothing started


def test_check_prints_only_the_missing_lines(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(FASHION)
    env = {"QBENCH_DATA": str(tmp_path / "nothing")}
    args = ("sweep", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out"), "--check")
    proc = qbench(*args, env=env)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("dataset fashion-mnist: no train-images") and line.endswith(FASHION_FIX)
    assert not (tmp_path / "out").exists()
    _write_idx_dir(tmp_path / "data" / "fashion-mnist")
    proc = qbench(*args, env={"QBENCH_DATA": str(tmp_path / "data")})
    assert proc.returncode == 0 and proc.stderr == ""
    assert "ready: every run that is not done yet (2 of 2) can start" in proc.stdout


def test_dry_run_shows_the_verdict_of_each_run(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(FASHION)
    env = {"QBENCH_DATA": str(tmp_path / "nothing"), "COLUMNS": "250"}
    proc = qbench("sweep", str(tmp_path / "s.yaml"), "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if "logreg-gloo" in line]
    assert len(rows) == 2
    verdicts = sorted(row.rstrip(" │").rsplit("│", 1)[1].strip() for row in rows)
    assert verdicts == ["needs fashion-mnist files", "ok"]
    assert "1 of 2 runs cannot start on this machine" in proc.stdout


@pytest.mark.slow
def test_skip_unavailable_records_skipped_never_failed(tmp_path: Path) -> None:
    """The runs that can start run; the others are skipped with the reason; a later sweep
    on a machine that has what they lacked runs exactly those."""
    text = FASHION + "steps_per_epoch: 2\nbatch_size: 8\ntimeout: 300\n"
    (tmp_path / "s.yaml").write_text(text)
    out = tmp_path / "out"
    args = ("sweep", str(tmp_path / "s.yaml"), "--out", str(out))
    env = {"QBENCH_DATA": str(tmp_path / "data")}
    proc = _process(*args, "--skip-unavailable", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 skipped (prerequisites missing)" in proc.stderr
    recs = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/run.json")}
    assert sorted(r["status"] for r in recs.values()) == ["ok", "skipped"], recs
    (skipped,) = [r for r in recs.values() if r["status"] == "skipped"]
    assert skipped["labels"]["dataset"] == "fashion-mnist"
    assert skipped["error"].startswith("skipped: this machine lacks dataset fashion-mnist: no ")
    assert not (out / skipped["run_id"] / "iterations.parquet").exists()
    report = _process("report", str(out), "--format", "csv")
    assert report.returncode == 0, report.stderr[-2000:]

    _write_idx_dir(tmp_path / "data" / "fashion-mnist")
    proc = _process(*args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 already done" in proc.stderr
    recs = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/run.json")}
    assert [r["status"] for r in recs.values()] == ["ok", "ok"]
