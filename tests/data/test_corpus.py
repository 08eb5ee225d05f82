"""The text corpus of the GPT workload (``dataset: fortunes``, Debian's fortunes in
/usr/share/games/fortunes): read as bytes, every 10th fortune held out, cut into windows whose
targets are the next bytes, scored per token with perplexity. The tests write their own small
corpus in the fortune format (nothing is read from the system)."""

from __future__ import annotations

import math
import random
import string
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from qbench.catalog import datasets as facts
from qbench.data import real
from qbench.errors import UserError
from qbench.run.loops import epochs
from qbench.spec import scenario
from qbench.spec.matrix import expand
from tests import invoke


def _corpus(root: Path, n: int = 40, words: str = "the cat sat on the mat", seed: int = -1) -> Path:
    """``root/fortunes/`` with two fortune files of n fortunes between them, and the strfile
    index and UTF-8 link Debian ships beside each (which the reader skips). ``seed`` >= 0: each
    fortune's words are random letters instead (no two windows alike)."""
    d = root / "fortunes"
    d.mkdir(parents=True)
    rng = random.Random(seed)
    text = (
        (lambda: "".join(rng.choices(string.ascii_lowercase + " ", k=40)))
        if seed >= 0
        else (lambda: words)
    )
    for name, part in (("alpha", range(0, n // 2)), ("beta", range(n // 2, n))):
        (d / name).write_text("\n%\n".join(f"{i}: {text()} {i}" for i in part) + "\n%\n")
        (d / f"{name}.dat").write_bytes(b"\x00\x01binary index")
        (d / f"{name}.u8").symlink_to(d / name)
    return d


def test_every_tenth_fortune_is_held_out_as_bytes(tmp_path: Path) -> None:
    ds = real.load("fortunes", _corpus(tmp_path))
    assert ds.num_classes == 256 and ds.train.y.numel() == ds.test.y.numel() == 0
    test = bytes(ds.test.x.to(torch.uint8).tolist()).decode()
    train = bytes(ds.train.x.to(torch.uint8).tolist()).decode()
    assert test.split("\n\n") == [f"{i}: the cat sat on the mat {i}" for i in (9, 19, 29, 39)]
    assert len(train.split("\n\n")) == 36 and "binary index" not in train + test


def test_missing_corpus_says_how_to_install_it(tmp_path: Path) -> None:
    assert facts.missing("fortunes", tmp_path) == f"no fortune files in {tmp_path}"
    with pytest.raises(UserError, match=r"apt-get install fortunes, or make data"):
        real.load("fortunes", tmp_path / "nothing")


def test_windows_target_the_next_byte_and_split_over_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(facts.DATA_ENV, str(tmp_path))
    _corpus(tmp_path, n=200, seed=0)
    two = [epochs.prepare("fortunes", (16,), world_size=2, rank=r, skew=0.0, seed=0,
                          device=torch.device("cpu")) for r in (0, 1)]  # fmt: skip
    for d in two:
        assert d.train_x.shape[1] == 16 and d.train_y.shape == d.train_x.shape
        assert d.num_classes == 256
    stream = real.load("fortunes", tmp_path / "fortunes").train.x
    n = (len(stream) - 1) // 16
    assert len(two[0].train_y) + len(two[1].train_y) >= n - 1  # equal shares of the windows
    windows = {tuple(w.tolist()) for d in two for w in d.train_x}
    assert len(windows) == len(two[0].train_x) + len(two[1].train_x)  # disjoint
    x, y = two[0].train_x[0], two[0].train_y[0]
    start = next(i for i in range(0, n * 16, 16) if torch.equal(stream[i : i + 16], x))
    assert torch.equal(y, stream[start + 1 : start + 17])


def test_a_language_model_is_scored_per_token_with_perplexity() -> None:
    """Nearly uniform logits over 256 bytes (byte 0 a hair ahead, so argmax picks it): loss
    log(256) per token, perplexity 256, top-1 the share of tokens that are byte 0."""

    class Uniform(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(*x.shape, 256)
            out[..., 0] = 1e-6
            return out

    y = torch.randint(1, 256, (6, 8))
    y[0, 0] = 0
    data = epochs.EpochData(train_x=y, train_y=y, test_x=y, test_y=y, num_classes=256)
    out = epochs.evaluate(Uniform(), data, _Solo())
    assert out["test_loss"] == pytest.approx(math.log(256), rel=1e-5)
    assert out["perplexity"] == pytest.approx(256, rel=1e-4)
    assert out["top1"] == pytest.approx(1 / 48)  # the one 0 of 48 tokens


class _Solo:
    rank, world_size, bytes_sent = 0, 1, 0

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        return None


@pytest.mark.parametrize(
    ("model", "dataset", "reason"),
    [("mlp", "fortunes", "model mlp does not; use model gpt"),
     ("gpt", "digits", "model gpt reads token sequences; use dataset fortunes or synthetic"),
     ("{name: gpt, vocab: 128}", "fortunes", "vocab 128 < 256 bytes; set vocab: 256")],
)  # fmt: skip
def test_text_and_token_models_go_together(model: str, dataset: str, reason: str) -> None:
    """Other pairs are excluded saying why, as is a label skew on text."""
    text = f"name: t\nmodel: [{model}, gpt]\ndataset: {dataset}\nepochs: 1\n"
    if dataset == "digits":
        text = f"name: t\nmodel: [{model}, mlp]\ndataset: {dataset}\nepochs: 1\n"
    m = expand(scenario.loads(text))
    assert any(reason in e.reason for e in m.excluded), [e.reason for e in m.excluded]
    skewed = expand(scenario.loads("name: t\nmodel: gpt\ndataset: fortunes\nepochs: 1\n"
                                   "skew: [0, 0.5]\n"))  # fmt: skip
    assert {e.reason for e in skewed.excluded} == {
        "skew 0.5 partitions by label, and text has none; drop skew for fortunes"
    }
    assert skewed.runs and all(r.workload.skew == 0 for r in skewed.runs)


@pytest.mark.slow
def test_gpt_learns_a_corpus_in_accuracy_mode(tmp_path: Path) -> None:
    """Two gloo ranks, 3 epochs of a tiny GPT on a repetitive corpus: the test loss and
    perplexity fall, and the report carries the final perplexity."""
    _corpus(tmp_path / "data", n=400)
    sc = tmp_path / "s.yaml"
    sc.write_text(
        "name: t\nmodel: {name: gpt, width: 32, layers: 1, heads: 2, seq_len: 16}\n"
        "dataset: fortunes\nworld_size: 2\nbackend: gloo\ncompressor: none\nepochs: 3\n"
        "optimizer: adam\nlr: 0.003\nbatch_size: 32\n"
    )
    out = tmp_path / "out"
    env = {**__import__("os").environ, facts.DATA_ENV: str(tmp_path / "data")}
    proc = invoke.run(
        [sys.executable, "-m", "qbench.cli", "sweep", str(sc), "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = [p.parent for p in out.glob("*/run.json")]
    ep = pd.read_parquet(run / "epochs.parquet")
    assert list(ep["epoch"]) == [1, 2, 3]
    assert ep["perplexity"].iloc[-1] < ep["perplexity"].iloc[0] < 256
    assert ep["perplexity"].iloc[-1] == pytest.approx(math.exp(ep["test_loss"].iloc[-1]))
    rep = invoke.run([sys.executable, "-m", "qbench.cli", "report", str(out)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert rep.returncode == 0, rep.stderr[-2000:]
    summary = pd.read_csv(out / "report" / "summary.csv")
    assert summary["final_perplexity"].iloc[0] == pytest.approx(ep["perplexity"].iloc[-1])
