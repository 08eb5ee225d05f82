"""Plug-ins: a third-party package (tests/plugin_example, installed by ``make venv``) adds a
compressor and a scheme through entry points, with no change inside qbench, and they work
wherever names are looked up: the planner, codecs, aggregators, ``bench``, the DDP hook,
``qbench info``, worker processes. The slow test sweeps the toy compressor next to qsgd and
finds its rows in the report.

Expected values come from the plug-in's own definition: 1 bit per value packed 8 to a byte, one
float32 scale per bucket of ``bucket_size`` values holding the bucket's mean |x|.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from qbench import aggregate, catalog, compress
from qbench.catalog import importpath, plugins
from qbench.errors import UserError
from qbench.spec import matrix, scenario
from qbench.timing import PhaseTimer
from tests import invoke
from tests.aggregate.test_gossip import LocalComm, on_threads

PLUGIN_DIST = "qbench-plugin-example"


def test_the_example_plugin_is_installed_in_the_test_venv() -> None:
    dist = importlib.metadata.distribution(PLUGIN_DIST)  # make venv installs it
    groups = {(ep.group, ep.name) for ep in dist.entry_points}
    assert groups == {("qbench.compressors", "scaledsign"), ("qbench.schemes", "decoded-mean")}


def test_entry_points_load_on_first_lookup_and_record_what_they_registered() -> None:
    assert "scaledsign" in catalog.COMPRESSORS and "decoded-mean" in catalog.SCHEMES
    mine = {p.name: p for p in plugins.LOADED if p.dist.startswith(PLUGIN_DIST)}
    assert mine["scaledsign"].registered == ("scaledsign",) and not mine["scaledsign"].error
    assert mine["decoded-mean"].registered == ("decoded-mean",)


def test_a_fresh_process_sees_the_plugin_without_importing_torch() -> None:
    # what a rank, a bench worker or `qbench sweep --dry-run` does: a lookup by name
    code = (
        "import sys; from qbench import catalog\n"
        "s = catalog.compressor({'name': 'scaledsign', 'bucket_size': 64})\n"
        "print(s.label, s.wire_bytes(100), catalog.scheme('decoded-mean').name,"
        " 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # 100 values: 13 bytes of signs + 2 buckets x 4 bytes of scales
    assert out.stdout.split() == ["scaledsign-b64", "21", "decoded-mean", "False"]


def test_the_planner_validates_plugin_parameters_and_applies_the_rules() -> None:
    sc = scenario.loads(
        "name: p\nmodel: mlp\nworld_size: 2\n"
        "scheme: [reduce-broadcast, allreduce, decoded-mean, {name: allgather, backward: true}]\n"
        "compressor: [{name: qsgd, bits: 4, bucket_size: 512}, {name: scaledsign, "
        "bucket_size: 128}]\n"
    )
    m = matrix.expand(sc)
    rows = sorted((r.method.scheme_label, r.compressor_label) for r in m.runs)
    assert ("reduce-broadcast", "scaledsign-b128") in rows
    assert ("decoded-mean", "scaledsign-b128") in rows
    assert ("allgather+backward", "scaledsign-b128") in rows
    reasons = [e.reason for e in m.excluded if "scaledsign" in e.description]
    assert reasons == [
        "allreduce sums raw buffers and cannot sum packed scaledsign payloads; use compressor "
        "none, fp16 or bf16, or scheme reduce-broadcast"
    ]
    with pytest.raises(UserError, match=r"scaledsign: bucket_size must be an integer >= 8, got 4"):
        catalog.compressor({"name": "scaledsign", "bucket_size": 4})
    assert catalog.from_label("scaledsign-b128").params == {"bucket_size": 128}


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 16, 17, 1000])
def test_the_codec_payload_is_the_declared_wire_layout(n: int) -> None:
    c = compress.build("scaledsign", bucket_size=8)
    payload = c.encode(torch.randn(n))
    assert payload.nbytes == catalog.compressor("scaledsign:bucket_size=8").wire_bytes(n)
    assert payload.nbytes == (n + 7) // 8 + 4 * -(-n // 8)


def test_the_codec_decodes_signs_times_each_buckets_mean_abs() -> None:
    x = torch.tensor([1.0, -3.0, 2.0, -2.0, 0.5, 0.0, -0.5, 1.0, 4.0, -2.0])
    c = compress.build("scaledsign", bucket_size=8)
    got = c.decode(c.encode(x))
    first = (1 + 3 + 2 + 2 + 0.5 + 0 + 0.5 + 1) / 8  # 1.25
    second = (4 + 2) / 2  # the short last bucket: its mean over the 2 values it holds
    want = [first, -first, first, -first, first, first, -first, first, second, -second]
    torch.testing.assert_close(got, torch.tensor(want))


def test_the_plugin_scheme_aggregates_on_two_ranks() -> None:
    x = torch.tensor([1.0, -3.0, 2.0, -2.0, 0.5, 0.0, -0.5, 1.0])

    def rank(cm: LocalComm) -> Any:
        agg = aggregate.build("decoded-mean", cm, compress.build("scaledsign", bucket_size=8), 8)
        out = agg.aggregate(x * (cm.rank + 1), 0, PhaseTimer(torch.device("cpu")))
        return out, agg.payload_bytes

    # rank 1 sends 2x: the decoded values are sign(x) * 1.25 and sign(x) * 2.5; the mean 1.875
    want = torch.where(x >= 0, 1.875, -1.875)
    for out, payload_bytes in on_threads(2, rank):
        torch.testing.assert_close(out, want)
        assert payload_bytes == 1 + 4


def test_bench_builds_plugin_compressors_and_schemes() -> None:
    from qbench.bench import comm as bench_comm
    from qbench.bench import kernels

    built, _ = kernels.resolve(["scaledsign:bucket_size=128"])
    assert [c.label for c in built] == ["scaledsign-b128"]
    s = bench_comm.settings(
        backends=["gloo"], world_sizes=[2], schemes=["decoded-mean"],
        compressors=["scaledsign:bucket_size=128"], min_bytes="1KB", max_bytes="4KB",
        step_factor=2, repeats=1, warmup=0, bandwidth=None,
    )  # fmt: skip
    combos, _ = bench_comm.plan("gloo", s.schemes, s.compressors)
    pairs = [(c["scheme"]["name"], c["compressor"]["name"]) for c in combos]
    assert pairs == [("allreduce", "none"), ("decoded-mean", "scaledsign")]  # fp32 baseline


def test_the_ddp_hook_runs_the_plugin_compressor_and_exchange(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import qbench.ddp

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = DDP(nn.Linear(30, 2, bias=False))  # one bucket of 60 values
        state = qbench.ddp.register(model, "scaledsign", bucket_size=16, exchange="decoded-mean")
        model(torch.randn(4, 30)).sum().backward()
        assert state.payload_bytes == (60 + 7) // 8 + 4 * 4  # 8 bytes of signs, 4 scales
    finally:
        dist.destroy_process_group()


def test_qbench_info_lists_the_plugins() -> None:
    from qbench.cli import cli

    result = CliRunner().invoke(cli, ["info"], terminal_width=300)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any("plug-in scaledsign" in line and "compressor scaledsign" in line for line in lines)
    # the schemes row, its cell wrapped over the lines whose first cell is empty
    start = next(i for i, line in enumerate(lines) if line.startswith("│ schemes "))
    row = [lines[start]]
    row += itertools.takewhile(lambda line: line.startswith("│  "), lines[start + 1 :])
    assert "decoded-mean" in " ".join(row)


def test_a_broken_plugin_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = importlib.metadata.EntryPoint("broken", "no_such_module_xyz:ENTRY", "qbench.compressors")
    loaded = plugins._load_one("qbench.compressors", ep)
    assert loaded.registered == ()
    assert loaded.error == "ModuleNotFoundError: No module named 'no_such_module_xyz'"
    monkeypatch.setattr(plugins, "LOADED", [*plugins.LOADED, loaded])
    with pytest.raises(UserError) as e:
        catalog.compressor("brokn")
    assert str(e.value).endswith(
        "; plug-in 'broken' (unknown package) failed to load: ModuleNotFoundError: No module "
        "named 'no_such_module_xyz'"
    )


def test_plugin_objects_are_checked_when_registered() -> None:
    with pytest.raises(UserError, match="a qbench plug-in must be a CompressorEntry"):
        plugins.register(42)
    from qbench.catalog.compressors import CompressorEntry

    bad = CompressorEntry("badcodec", "x", "", codec="not a path")
    with pytest.raises(UserError, match=r"compressor badcodec: codec 'not a path' is not an "):
        plugins.register(bad)
    assert "badcodec" not in catalog.COMPRESSORS


def test_a_codec_path_that_does_not_import_is_one_line_naming_it() -> None:
    from qbench.catalog.compressors import CompressorEntry

    entry = CompressorEntry("ghostcodec", "x", "", codec="no_such_pkg_q.codec:Ghost")
    catalog.register_compressor(entry)
    try:
        with pytest.raises(UserError) as e:
            compress.build("ghostcodec")
        assert str(e.value) == (
            "compressor ghostcodec: codec 'no_such_pkg_q.codec:Ghost' cannot be imported "
            "(ModuleNotFoundError: No module named 'no_such_pkg_q'); install its package or "
            "run from the directory that holds no_such_pkg_q"
        )
    finally:
        catalog.COMPRESSORS.pop("ghostcodec")


@pytest.mark.parametrize(
    ("path", "message"),
    [("mypkg.nets", "is not an import path"), ("my-pkg:build", "is not an import path"),
     ("json:nothere", "module json has no attribute 'nothere'")],
)  # fmt: skip
def test_import_paths_are_checked_by_spelling_then_by_import(path: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        importpath.resolve(path, "model factory")


def test_import_paths_find_modules_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "here_mod_q.py").write_text("VALUE = 7\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    assert importpath.resolve("here_mod_q:VALUE", "x") == 7


@pytest.mark.slow
def test_a_sweep_runs_the_plugin_next_to_qsgd_and_reports_its_rows(tmp_path: Path) -> None:
    text = (
        "name: plugin\nmodel: mlp\nworld_size: 2\nbackend: gloo\nwarmup: 1\niterations: 3\n"
        "scheme: [reduce-broadcast, decoded-mean, ddp]\n"
        "compressor: [{name: qsgd, bits: 4, bucket_size: 512}, "
        "{name: scaledsign, bucket_size: 128}]\n"
    )
    (tmp_path / "s.yaml").write_text(text)
    out = tmp_path / "res"
    qbench = [sys.executable, "-m", "qbench.cli"]
    run = invoke.run([*qbench, "sweep", str(tmp_path / "s.yaml"), "--out", str(out)],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rep = invoke.run([*qbench, "report", str(out), "--format", "json"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert rep.returncode == 0, rep.stderr[-2000:]
    rows = json.loads(rep.stdout)
    got = sorted((r["scheme"], r["compressor"], r["status"]) for r in rows)
    assert got == [
        ("decoded-mean", "qsgd-4b-b512", "ok"), ("decoded-mean", "scaledsign-b128", "ok"),
        ("reduce-broadcast", "qsgd-4b-b512", "ok"), ("reduce-broadcast", "scaledsign-b128", "ok"),
        ("reduce-broadcast+backward", "qsgd-4b-b512", "ok"),
        ("reduce-broadcast+backward", "scaledsign-b128", "ok"),
    ]  # fmt: skip
    for r in rows:
        if r["compressor"] == "scaledsign-b128":
            # at least 99 % of the values at 1 + 32/128 bits, the rest at 32 (the layer policy)
            assert 1.25 < r["bits_per_value"] < 0.99 * 1.25 + 0.01 * 32


@pytest.mark.slow
def test_bench_comm_and_kernels_measure_the_plugin(tmp_path: Path) -> None:
    qbench = [sys.executable, "-m", "qbench.cli", "bench"]
    comm_json, kernels_json = tmp_path / "comm.json", tmp_path / "kernels.json"
    args = [*qbench, "comm", "--world-size", "2", "--scheme", "decoded-mean", "--compressor",
            "scaledsign:bucket_size=128", "--min-bytes", "4KB", "--max-bytes", "4KB",
            "--repeats", "2", "--warmup", "1", "--json", str(comm_json)]  # fmt: skip
    run = invoke.run(args, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "scaledsign-b128" in comm_json.read_text()
    args = [*qbench, "kernels", "--sizes", "12", "--repeats", "2", "--compressor",
            "scaledsign:bucket_size=128", "--json", str(kernels_json)]  # fmt: skip
    run = invoke.run(args, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "scaledsign-b128" in kernels_json.read_text()
