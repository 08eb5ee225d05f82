"""``qbench bench numerics``' settings and the formats it compares (qbench.bench.numerics
settings / resolve): each bad value is one line naming it and an example, the defaults are
what the docs say, and a default format this tree cannot build is skipped with a note. The
mutation run of issue 44 found these untested (tests/test_bench_numerics.py measures)."""

from __future__ import annotations

import pytest

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
    with pytest.raises(UserError, match="is a DDP communication hook, not a codec"):
        numerics.resolve(["powersgd"])
    found, notes = numerics.resolve(["qsgd:bits=4"])
    assert [s["name"] for s in found] == ["qsgd"] and notes == []
