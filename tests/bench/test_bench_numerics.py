"""qbench bench numerics: the orders through the command's pipeline, what the metrics show on
known cases, the JSON document, and the command line's errors (the orders themselves:
tests/bench/test_bench_numerics_orders.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from qbench.bench import numerics
from qbench.bench.numerics import gradients
from qbench.cli import cli
from qbench.errors import UserError
from qbench.report import numerics as report_numerics
from qbench.report.plots import numerics as plots_numerics
from qbench.run.gradients import ModelGradients
from tests.invoke import qbench


class Correlated:
    """Gradient-like rows: a shared direction plus per-rank noise, fresh every repeat."""

    rows: int | None = None

    def __init__(self, numel: int, noise: float = 0.5) -> None:
        self.numel = numel
        self.noise = noise

    def gradients(self, repeat: int, ranks: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 + repeat)
        common = torch.randn(self.numel, generator=g) * 1e-2
        return common + self.noise * 1e-2 * torch.randn(ranks, self.numel, generator=g)

    def describe(self) -> dict[str, Any]:
        return {"kind": "test"}


def _rows(doc: dict[str, Any]) -> dict[tuple[str, str, int], report_numerics.Summary]:
    found = report_numerics.summarize(report_numerics.rows(doc, "test"))
    return {(s.compressor, s.order, s.ranks): s for s in found}


def _run(source: Any, **kw: Any) -> dict[str, Any]:
    result = numerics.measure(numerics.settings(**kw), source)
    return report_numerics.with_summary(numerics.to_document(result))


def _x(k: int, n: int, seed: int = 0) -> torch.Tensor:
    return Correlated(n).gradients(seed, k)


# -- the orders, through the pipeline -----------------------------------------------------------
def test_none_is_fp32_summation_error_only_in_every_order() -> None:
    doc = _run(Correlated(3000), specs=["none"], ranks=[2, 7, 64], repeats=2, numel=3000)
    ok = [s for s in _rows(doc).values() if s.status == "ok"]
    assert {s.order for s in ok} == {"ring", "tree", "allgather", "alltoall"}
    for s in ok:
        assert 0 <= s.median < 1e-6, s
        assert s.cosine == pytest.approx(1.0, abs=1e-12)


def test_a_per_tensor_format_over_the_call_budget_is_not_applicable() -> None:
    doc = _run(Correlated(256), specs=["fp8:format=e4m3"], ranks=[4, 8], orders=["ring", "tree"],
               repeats=1, numel=256, max_calls=20)  # fmt: skip
    found = _rows(doc)
    assert found[("fp8-e4m3", "ring", 4)].status == "ok"  # 16 calls
    ring8 = found[("fp8-e4m3", "ring", 8)]
    assert ring8.status == "n/a" and "--max-calls 20" in ring8.reason
    assert found[("fp8-e4m3", "tree", 8)].status == "ok"  # 15 calls
    assert math.isnan(ring8.median)


# -- what the metrics show -----------------------------------------------------------------------
def test_unbiased_stochastic_rounding_averages_out_over_repeats() -> None:
    doc = _run(Correlated(4096), specs=["qsgd:bits=4"], ranks=[8], orders=["allgather"],
               repeats=16, numel=4096)  # fmt: skip
    s = _rows(doc)[("qsgd-4b-b512", "allgather", 8)]
    assert s.repeats == 16
    assert s.bias < 0.4 * s.median  # about error / sqrt(16)
    assert s.bias == pytest.approx(s.noise_floor, rel=0.3)


def test_fixed_rows_make_a_deterministic_format_fully_biased(tmp_path: Path) -> None:
    """The same gradients every repeat (a file): nearest rounding makes the same error each time,
    so the bias is the whole error, far above the noise floor."""
    path = tmp_path / "g.pt"
    torch.save(_x(4, 512), path)
    source = gradients.load(path, 0)
    doc = _run(source, specs=["bf16"], ranks=[4], orders=["allgather"], repeats=4, numel=0)
    s = _rows(doc)[("bf16", "allgather", 4)]
    assert s.bias == pytest.approx(s.median, rel=1e-9)
    assert s.bias > 1.9 * s.noise_floor  # sqrt(4) = 2 apart


def test_ring_error_grows_with_k_and_allgather_does_not() -> None:
    doc = _run(Correlated(2048), specs=["bf16"], ranks=[2, 8, 32, 128], orders=["ring",
               "allgather"], repeats=2, numel=2048)  # fmt: skip
    slopes = {g["order"]: g["slope"] for g in doc["growth"]}
    assert slopes["ring"] > 0.3  # partial sums rounded at every hop: ~ sqrt(K)
    assert slopes["allgather"] < 0.1  # every gradient rounded once: flat or falling
    rows = _rows(doc)
    assert rows[("bf16", "ring", 128)].median > 3 * rows[("bf16", "allgather", 128)].median


# -- the document ----------------------------------------------------------------------------------
def test_document_round_trips_with_every_raw_sample(tmp_path: Path) -> None:
    doc = _run(Correlated(512), specs=["none", "qsgd:bits=8"], ranks=[2, 4], repeats=3, numel=512)
    path = tmp_path / "n.json"
    path.write_text(json.dumps(doc))
    back = json.loads(path.read_text())
    assert back["schema"] == numerics.SCHEMA == report_numerics.SCHEMA == "qbench.bench.numerics/1"
    assert back["simulated"] == "simulated ranks (one process)"
    assert {"machine", "versions", "git_commit", "settings", "source", "summary", "growth"} <= set(
        back
    )
    assert back["versions"]["torch"] == torch.__version__
    assert back["settings"]["ranks"] == [2, 4] and back["settings"]["repeats"] == 3
    ok = [r for r in back["rows"] if r["status"] == "ok"]
    assert len(back["rows"]) == 2 * 5 * 2 and len(ok) == 2 * 4 * 2 + 2  # fp32 has no integers
    assert all(len(r["samples"]) == 3 for r in ok)
    assert {s["repeat"] for s in ok[0]["samples"]} == {0, 1, 2}
    assert report_numerics.summarize(report_numerics.rows(back, "x")) == report_numerics.summarize(
        report_numerics.rows(doc, "y")
    )
    with pytest.raises(UserError, match="not a `qbench bench numerics --json` file"):
        report_numerics.rows({"schema": "qbench.bench.kernels/1"}, "k.json")


def test_figure_is_written_in_the_suffix_format(tmp_path: Path) -> None:
    doc = _run(Correlated(256), specs=["bf16"], ranks=[2, 4], orders=["ring"], repeats=1,
               numel=256)  # fmt: skip
    for name, magic in (("f.png", b"\x89PNG"), ("f.pdf", b"%PDF")):
        path = plots_numerics.write(doc, tmp_path / name)
        assert path.read_bytes().startswith(magic)
    with pytest.raises(UserError, match=r"\.png or \.pdf"):
        plots_numerics.check_path(tmp_path / "f.svg")


def test_model_gradients_differ_per_rank_and_repeat_and_are_reproducible() -> None:
    a = ModelGradients("logreg", numel=300, batch_size=8)
    g0, g1 = a.gradients(0, 3), a.gradients(1, 3)
    assert g0.shape == (3, 300) and g0.dtype == torch.float32
    assert not torch.equal(g0[0], g0[1]) and not torch.equal(g0[0], g1[0])
    assert torch.equal(ModelGradients("logreg", numel=300, batch_size=8).gradients(0, 3), g0)
    assert a.describe()["parameters"] == 7850 and a.describe()["numel"] == 300


# -- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"ranks": [1]}, "ranks must be integers 2..1024"),
        ({"ranks": [2, 2048]}, "2048"),
        ({"orders": ["rign"]}, "did you mean 'ring'"),
        ({"repeats": 0}, "repeats must be >= 1"),
        ({"numel": -1}, "numel must be >= 0"),
    ],
)  # fmt: skip
def test_bad_settings_are_one_line_user_errors(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(UserError, match=words) as e:
        numerics.settings(**kw)
    assert "\n" not in str(e.value)


def test_bad_gradient_files(tmp_path: Path) -> None:
    one_d, ints, small = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    torch.save(torch.zeros(8), one_d)
    torch.save(torch.zeros(2, 4, dtype=torch.int32), ints)
    torch.save(torch.randn(3, 16), small)
    with pytest.raises(UserError, match=r"a 1-D torch\.float32 tensor"):
        gradients.load(one_d)
    with pytest.raises(UserError, match="2-D float tensor"):
        gradients.load(ints)
    with pytest.raises(UserError, match="does not exist"):
        gradients.load(tmp_path / "none.pt")
    with pytest.raises(UserError, match="--ranks 4 needs 4 gradient rows, the gradients file has"):
        numerics.measure(numerics.settings(ranks=[2, 4]), gradients.load(small))


def test_cli_runs_and_writes_json_and_figure(tmp_path: Path) -> None:
    grads, out, fig = tmp_path / "g.pt", tmp_path / "n.json", tmp_path / "n.png"
    torch.save(_x(8, 300), grads)
    argv = ["bench", "numerics", "--gradients", str(grads), "--ranks", "2", "8", "--compressor",
            "none", "fp16", "--order", "ring", "allgather", "--repeats", "2", "--json", str(out),
            "--figure", str(fig)]  # fmt: skip
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 0, res.output
    assert "simulated ranks (one process)" in res.output and "fp16" in res.output
    # what each order rounds, under the tables
    assert "order ring: low-precision ring: each partial sum encoded when it is sent on" in (
        " ".join(res.output.split())
    )
    assert "order allgather: " in res.output and "order tree: " not in res.output
    assert "repeat 2/2" in res.output  # progress (stderr, mixed in here)
    doc = json.loads(out.read_text())
    assert doc["source"]["kind"] == "file" and doc["source"]["rows"] == 8
    assert fig.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--ranks", "2", "4096"], "4096"),
        (["--order", "tree", "--order", "star"], "unknown order 'star'"),
        (["--model", "mlp", "--gradients", "g.pt"], "not both"),
        (["--figure", "f.svg"], ".png or .pdf"),
        (["--compressor", "qsgd:bits=99"], "bits"),
        (["--compressor", "powersgd"], "not a codec"),
    ],
)  # fmt: skip
def test_cli_bad_input_raises_user_error(args: list[str], words: str) -> None:
    res = CliRunner().invoke(cli, ["bench", "numerics", "--repeats", "1", *args])
    assert isinstance(res.exception, UserError), res.output
    assert words in str(res.exception) and "\n" not in str(res.exception)


def test_cli_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "g.pt"
    torch.save(torch.randn(3, 8), path)
    proc = qbench("bench", "numerics", "--gradients", str(path), "--ranks", "2", "16")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "--ranks 16 needs 16 gradient rows, the gradients file has 3" in proc.stderr
