"""``bench numerics --gradients FILE`` (qbench.bench.numerics.gradients.load): each way a file
can be wrong is one line naming it, and a good file gives its rows cut to ``numel``. The
mutation run of issue 44 found these messages and edges untested (tests/bench/test_bench_numerics.py
holds the measurements)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from qbench.bench.numerics.gradients import FileGradients, load
from qbench.errors import UserError


def _saved(tmp_path: Path, value: object, name: str = "g.pt") -> Path:
    path = tmp_path / name
    torch.save(value, path)
    return path


def _error(path: Path) -> str:
    with pytest.raises(UserError) as e:
        load(path)
    return str(e.value)


def test_a_good_file_gives_its_rows_cut_to_numel(tmp_path: Path) -> None:
    table = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    path = _saved(tmp_path, table)
    whole = load(path)
    assert isinstance(whole, FileGradients) and whole.path == path
    assert (whole.rows, whole.total, whole.numel) == (3, 4, 4)
    assert whole.table.dtype == torch.float32 and whole.table.is_contiguous()
    assert torch.equal(whole.gradients(repeat=5, ranks=2), table[:2].float())
    cut = load(path, numel=3)
    assert cut.numel == 3 and torch.equal(cut.table, table[:, :3].float())
    assert load(path, numel=99).numel == 4  # no more than the file holds
    assert cut.describe() == {"kind": "file", "path": str(path), "rows": 3, "values": 4,
                              "numel": 3, "repeats": "the same rows"}  # fmt: skip
    one = load(_saved(tmp_path, torch.ones(1, 1), "one.pt"))  # one rank, one value is enough
    assert (one.rows, one.numel) == (1, 1)


def test_each_bad_file_is_one_line_naming_it_and_the_fix(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    assert _error(junk) == (
        f"gradients file {junk} cannot be read by torch.load (UnpicklingError); save a 2-D "
        "float tensor with torch.save(tensor, path)"
    )
    pickled = tmp_path / "obj.pt"
    pickled.write_bytes(pickle.dumps(object(), protocol=2))  # not allowed by weights_only loading
    assert "cannot be read by torch.load" in _error(pickled)
    dict_path = _saved(tmp_path, {"a": torch.zeros(2, 2)}, "d.pt")
    assert _error(dict_path) == (
        f"gradients file {dict_path} holds a dict; it must be a 2-D float tensor [ranks, values], "
        "one row per rank"
    )
    three = _saved(tmp_path, torch.zeros(2, 2, 2), "t.pt")
    assert _error(three).startswith(f"gradients file {three} holds a 3-D torch.float32 tensor;")
    missing = tmp_path / "none.pt"
    assert _error(missing) == (
        f"gradients file {missing} does not exist; give a torch.save'd tensor"
    )


@pytest.mark.parametrize("shape", [(0, 4), (3, 0)])
def test_an_empty_table_is_refused(tmp_path: Path, shape: tuple[int, int]) -> None:
    path = _saved(tmp_path, torch.zeros(shape))
    assert _error(path) == f"gradients file {path} is empty ({shape}); save [ranks, n]"


def test_the_first_non_finite_value_is_named(tmp_path: Path) -> None:
    table = torch.zeros(3, 5)
    table[1, 3], table[2, 0] = float("inf"), float("nan")
    path = _saved(tmp_path, table)
    assert _error(path) == (
        f"gradients file {path}: row 1 value 3 is inf; the codecs take finite values only"
    )
    # a value past numel is not sent, so it is not checked
    assert load(_saved(tmp_path, table[:1].clone(), "row0.pt"), numel=2).numel == 2
    late = torch.zeros(1, 5)
    late[0, 4] = float("nan")
    assert load(_saved(tmp_path, late, "late.pt"), numel=4).numel == 4
