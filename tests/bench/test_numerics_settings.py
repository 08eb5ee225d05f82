"""``qbench bench numerics``' settings and the formats it compares (qbench.bench.numerics
settings / resolve): each bad value is one line naming it and an example, the defaults are
what the docs say, and a default format this tree cannot build is skipped with a note. The
mutation run of issue 44 found these untested (tests/bench/test_bench_numerics.py measures)."""

from __future__ import annotations

import re

import pytest
import torch

from qbench.bench import numerics
from qbench.errors import UserError


def _error(**kw: object) -> str:
    with pytest.raises(UserError) as e:
        numerics.settings(**kw)  # type: ignore[arg-type]
    return str(e.value)


def test_the_defaults() -> None:
    s = numerics.settings()
    assert s.specs == () and s.ranks == numerics.DEFAULT_RANKS == (2, 4, 8, 16, 32, 64, 128, 256,
                                                                   512, 1024)  # fmt: skip
    assert s.orders == numerics.ORDERS
    assert (s.repeats, s.numel, s.max_calls, s.threads) == (5, 4096, 4096, 1)
    given = numerics.settings(ranks=[16, 2, 16], orders=["ring", "tree", "ring"], numel=0,
                              max_calls=1, threads=3, repeats=1)  # fmt: skip
    assert given.ranks == (2, 16) and given.orders == ("ring", "tree")
    assert (given.numel, given.max_calls, given.threads, given.repeats) == (0, 1, 3, 1)


@pytest.mark.parametrize(
    ("kw", "message"),
    [({"ranks": [1]}, "ranks must be integers 2..1024 (simulated in one process), got 1; e.g. "
      "`--ranks 2 16 256`"),
     ({"ranks": [1025]}, "got 1025;"), ({"ranks": [True]}, "got True;"),
     ({"ranks": [2.0]}, "got 2.0;"),
     ({"repeats": 0}, "repeats must be >= 1, got 0; e.g. `--repeats 5`"),
     ({"numel": -1}, "numel must be >= 0, got -1; e.g. `--numel 4096 (0: the whole gradient)`"),
     ({"max_calls": 0}, "max calls must be >= 1, got 0; e.g. `--max-calls 4096`"),
     ({"threads": 0}, "threads must be >= 1, got 0; e.g. `--threads 1`")],
)  # fmt: skip
def test_a_bad_setting_is_one_line_naming_it_and_an_example(kw: dict, message: str) -> None:
    text = _error(**kw)
    assert message in text and "\n" not in text, text


def test_ranks_at_the_bounds_are_fine() -> None:
    assert numerics.settings(ranks=[2, 1024]).ranks == (2, 1024)


def test_default_formats_this_tree_cannot_build_are_skipped_with_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(numerics, "DEFAULT_SPECS", ("bf16", "nosuch:bits=2", "powersgd", "fp16"))
    found, notes = numerics.resolve(())
    assert [s["name"] for s in found] == ["bf16", "fp16"]  # the ones after a skip still come
    assert notes[0] == "skipped nosuch:bits=2: 'nosuch' is not registered"
    assert notes[1].startswith("skipped powersgd: ") and "is a DDP communication hook" in notes[1]
    assert len(notes) == 2


def test_a_format_asked_for_must_build() -> None:
    with pytest.raises(UserError) as e:
        numerics.resolve(["powersgd"])
    assert str(e.value).endswith(
        " is a DDP communication hook, not a codec; pick a codec, e.g. `--compressor qsgd:bits=8`"
    )
    found, notes = numerics.resolve(["qsgd:bits=4"])
    assert [s["name"] for s in found] == ["qsgd"] and notes == []


class _Rows:
    """A gradient source of ``rows`` rows of ``numel`` values (``None``: any number of rows)."""

    def __init__(self, numel: int, rows: int | None = None) -> None:
        self.numel, self.rows = numel, rows

    def gradients(self, repeat: int, ranks: int) -> torch.Tensor:
        return torch.arange(1.0, 1.0 + ranks * self.numel).view(ranks, self.numel) / 7

    def describe(self) -> dict[str, object]:
        return {"kind": "test"}


def test_the_draws_index_bounds_k_times_numel() -> None:
    """Draws are keyed by a 32-bit element index: K x numel must stay below 2^32."""
    s = numerics.settings(ranks=[2])
    numerics.check_source(_Rows(2**31 - 1), s)  # type: ignore[arg-type]
    with pytest.raises(UserError) as e:
        numerics.check_source(_Rows(2**31), s)  # type: ignore[arg-type]
    assert str(e.value) == (
        "2 ranks x 2147483648 values is over 2^32 values, the draws' index; use "
        "--numel up to 2147483647"
    )
    with pytest.raises(UserError) as e:
        numerics.check_source(_Rows(10, rows=1), s)  # type: ignore[arg-type]
    assert str(e.value) == (
        "--ranks 2 needs 2 gradient rows, the gradients file has 1; use --ranks up to 1 or "
        "save more rows"
    )


def test_progress_lines_counts_and_times() -> None:
    lines: list[str] = []
    s = numerics.settings(specs=["bf16", "fp8"], ranks=[2, 4], orders=["allgather", "integer"],
                          repeats=2, numel=64)  # fmt: skip
    result = numerics.measure(s, _Rows(64), lines.append)  # type: ignore[arg-type]
    assert lines[0] == "repeat 1/2: gradients of 4 simulated ranks (one process)"
    assert re.fullmatch(r"repeat 1/2: gradients took \d+\.\d s", lines[1])
    assert lines[2] == "repeat 1/2, K = 2: 2 formats x 2 orders"
    assert lines[4] == "repeat 2/2: gradients of 4 simulated ranks (one process)"
    assert len(lines) == 8 and 0 <= result.seconds < 60
    rows = {(r.compressor, r.order, r.ranks): r for r in result.rows}
    bf16 = rows[("bf16", "integer", 4)]
    assert bf16.status == "n/a" and bf16.reason.startswith("bf16 has no integer view: ")
    assert all(r.numel == 64 for r in result.rows)
    ok = [r for r in result.rows if r.status == "ok"]
    assert ok and all(0 <= smp.seconds < 60 for r in ok for smp in r.samples)
    assert all(len(r.samples) == 2 for r in ok)


def test_the_call_budget_is_inclusive() -> None:
    """``--max-calls N`` runs an order that needs exactly N encode calls."""
    from qbench.bench.numerics import orders
    from qbench.compress import from_spec

    comp = from_spec("fp8")  # one scale per tensor: every message is an encode call
    need = orders.calls("ring", 4, orders.grid(comp) is None)
    assert need == 16
    assert numerics._skip_reason(comp, "ring", 4, need) == ""
    assert "over --max-calls" in numerics._skip_reason(comp, "ring", 4, need - 1)


def test_each_codecs_grid_and_each_orders_calls() -> None:
    """The bucket grid a codec's calls may be merged on: 1 for a per-value cast, the scale's
    block (from the catalog, else the codec's bucket_size: 1bitSGD), None for a per-tensor
    scale; and the encode calls one sample of each order makes at K ranks."""
    from qbench.bench.numerics import orders
    from qbench.compress import from_spec

    grids = {s: orders.grid(from_spec(s)) for s in
             ("bf16", "qsgd:bits=8,bucket_size=256", "mx", "fp8:block_size=64",
              "onebit:bucket_size=128", "fp8")}  # fmt: skip
    assert grids == {"bf16": 1, "qsgd:bits=8,bucket_size=256": 256, "mx": 32,
                     "fp8:block_size=64": 64, "onebit:bucket_size=128": 128,
                     "fp8": None}  # fmt: skip
    table = {(order, per_call): orders.calls(order, 8, per_call)
             for order in ("ring", "alltoall", "tree", "allgather", "integer")
             for per_call in (True, False)}  # fmt: skip
    assert table == {("ring", True): 64, ("ring", False): 8, ("alltoall", True): 64,
                     ("alltoall", False): 17, ("tree", True): 8, ("tree", False): 8,
                     ("allgather", True): 8, ("allgather", False): 8, ("integer", True): 8,
                     ("integer", False): 8}  # fmt: skip
