"""qbench bench numerics: the reduction orders against hand-made encode sequences, what the
metrics show on known cases, the JSON document, and the command line's errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from qbench import compress
from qbench.aggregate.base import split_ranges
from qbench.bench import numerics, numerics_gradients
from qbench.bench import numerics_orders as orders
from qbench.cli import cli
from qbench.compress import Key, integer_sum
from qbench.errors import UserError
from qbench.report import numerics as report_numerics
from qbench.report import plots_numerics
from qbench.run.gradients import ModelGradients


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


# -- the orders ----------------------------------------------------------------------------------
def test_ring_at_two_ranks_is_the_hand_computed_sequence() -> None:
    comp = compress.from_spec("qsgd:bits=4,bucket_size=4", seed=3)  # stochastic: keys matter
    x = _x(2, 10)
    assert split_ranges(10, 2, 4) == [(0, 4), (4, 10)]

    def rt(v: torch.Tensor, stream: int, offset: int) -> torch.Tensor:
        return comp.decode(comp.encode(v.contiguous(), stream=stream, offset=offset))

    c0 = rt(x[1, 0:4], 1, 0) + x[0, 0:4]  # chunk 0 starts at rank 1, ends at its owner 0
    c1 = rt(x[0, 4:10], 1, 4) + x[1, 4:10]  # chunk 1 starts at rank 0, ends at rank 1
    want = torch.cat([rt(c0 / 2, 2, 0), rt(c1 / 2, 2, 4)])  # the owners' means, allgathered
    got = orders.ring(orders.Rounder(comp), x)
    assert torch.equal(got, want)
    assert torch.equal(orders.ring(orders.Rounder(comp, batch=False), x), want)
    assert not torch.equal(got, orders.ring(orders.Rounder(compress.from_spec(
        "qsgd:bits=4,bucket_size=4", seed=4)), x))  # fmt: skip


@pytest.mark.parametrize("spec", ["qsgd:bits=4,bucket_size=8", "mx:element=e2m1", "bf16"])
@pytest.mark.parametrize("order", ["ring", "tree", "allgather", "alltoall"])
def test_merged_calls_give_the_bits_of_one_call_per_message(spec: str, order: str) -> None:
    """The Rounder merges a stream's messages into one call only where that changes no bit."""
    comp = compress.from_spec(spec, seed=1)
    x = _x(6, 200)  # 25 qsgd buckets of 8 but not whole MX blocks of 32: rows merge for one only
    run = orders.ORDERS[order]
    assert run is not None
    merged, single = orders.Rounder(comp), orders.Rounder(comp, batch=False)
    assert torch.equal(run(merged, x), run(single, x))
    assert merged.calls == single.calls  # messages counted the same either way


def test_per_tensor_formats_are_called_once_per_message() -> None:
    comp = compress.from_spec("fp8:format=e4m3")  # one scale per call
    assert orders.grid(comp) is None
    rt = orders.Rounder(comp)
    orders.ring(rt, _x(4, 64))
    assert rt.calls == orders.calls("ring", 4, per_call=True) == 16


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
    source = numerics_gradients.load(path, 0)
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


@pytest.mark.parametrize("spec", ["qsgd:bits=8", "mx:element=e2m1"])
def test_integer_order_sums_the_codes_exactly(spec: str) -> None:
    """The integer order's mean is the float64 mean of the ranks' integer codes on the shared
    scales, to float32 rounding: no sum in between is rounded."""
    comp = compress.from_spec(spec, seed=2)
    view = integer_sum.for_compressor(comp)
    assert view is not None
    k, n = 16, 1000
    x = _x(k, n)
    got = orders.integer(view, x, comp.seed)
    stats = torch.stack([view.local_scales(x[r]) for r in range(k)]).amax(0)
    scales = view.share(stats)
    codes = torch.stack([
        view.encode(x[r], scales, Key(seed=comp.seed), r * n, torch.int32) for r in range(k)
    ]).to(torch.int64)  # fmt: skip
    ones = torch.empty(n)
    per_code = view.decode(torch.ones(n, dtype=torch.int32), scales, 1, ones).double()
    exact = (codes.sum(0).double() * per_code) / k  # one code's value, times the exact sum
    assert torch.allclose(got.double(), exact, rtol=2**-22, atol=0)
    assert codes.abs().max() <= view.top


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
        numerics_gradients.load(one_d)
    with pytest.raises(UserError, match="2-D float tensor"):
        numerics_gradients.load(ints)
    with pytest.raises(UserError, match="does not exist"):
        numerics_gradients.load(tmp_path / "none.pt")
    with pytest.raises(UserError, match="--ranks 4 needs 4 gradient rows, the gradients file has"):
        numerics.measure(numerics.settings(ranks=[2, 4]), numerics_gradients.load(small))


def test_cli_runs_and_writes_json_and_figure(tmp_path: Path) -> None:
    grads, out, fig = tmp_path / "g.pt", tmp_path / "n.json", tmp_path / "n.png"
    torch.save(_x(8, 300), grads)
    argv = ["bench", "numerics", "--gradients", str(grads), "--ranks", "2", "8", "--compressor",
            "none", "fp16", "--order", "ring", "allgather", "--repeats", "2", "--json", str(out),
            "--figure", str(fig)]  # fmt: skip
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 0, res.output
    assert "simulated ranks (one process)" in res.output and "fp16" in res.output
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
    proc = subprocess.run(
        [sys.executable, "-m", "qbench.cli", "bench", "numerics", "--gradients", str(path),
         "--ranks", "2", "16"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "--ranks 16 needs 16 gradient rows, the gradients file has 3" in proc.stderr
