"""Where ``qbench bench numerics`` takes the ranks' gradients from: any object with the
:class:`GradientSource` shape (a zoo model's, ``qbench.run.gradients.ModelGradients``), or the
rows of a saved tensor (:func:`load`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from qbench.errors import UserError


class GradientSource(Protocol):
    """The ranks' gradients: ``qbench.run.gradients.ModelGradients`` or :class:`FileGradients`."""

    rows: int | None
    """The most ranks it can give (None: any number)."""
    numel: int

    def gradients(self, repeat: int, ranks: int) -> torch.Tensor:
        """[ranks, numel] float32: row r is rank r's gradient at this repeat."""
        ...

    def describe(self) -> dict[str, Any]:
        """Where the gradients come from, for the document."""
        ...


class FileGradients:
    """Rows of a saved 2-D float tensor (``torch.save``), one per rank, the same every repeat:
    only the codec seed changes, so a deterministic codec's bias is its error."""

    def __init__(self, path: Path, table: torch.Tensor, numel: int) -> None:
        self.path = path
        self.rows: int | None = table.shape[0]
        self.total = table.shape[1]
        self.numel = min(numel, self.total) if numel else self.total
        self.table = table[:, : self.numel].to(torch.float32).contiguous()

    def gradients(self, repeat: int, ranks: int) -> torch.Tensor:
        return self.table[:ranks]

    def describe(self) -> dict[str, Any]:
        return {"kind": "file", "path": str(self.path), "rows": self.rows,
                "values": self.total, "numel": self.numel, "repeats": "the same rows"}  # fmt: skip


def load(path: Path, numel: int = 0) -> FileGradients:
    """A ``--gradients`` file: ``torch.save`` of a 2-D float tensor [R, n], one row per rank,
    cut to its first ``numel`` values (0: all); UserError naming what is wrong otherwise."""
    try:
        table = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise UserError(f"gradients file {path} does not exist; give a torch.save'd tensor") from e
    except Exception as e:
        raise UserError(
            f"gradients file {path} cannot be read by torch.load ({type(e).__name__}); save a "
            "2-D float tensor with torch.save(tensor, path)"
        ) from e
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or not table.is_floating_point():
        what = (f"a {table.dim()}-D {table.dtype} tensor" if isinstance(table, torch.Tensor)
                else f"a {type(table).__name__}")  # fmt: skip
        raise UserError(
            f"gradients file {path} holds {what}; it must be a 2-D float tensor [ranks, values], "
            "one row per rank"
        )
    if table.shape[0] < 1 or table.shape[1] < 1:
        raise UserError(f"gradients file {path} is empty ({tuple(table.shape)}); save [ranks, n]")
    source = FileGradients(path, table, numel)
    bad = ~torch.isfinite(source.table)
    if bool(bad.any()):
        r, i = (int(v) for v in bad.nonzero()[0])
        raise UserError(
            f"gradients file {path}: row {r} value {i} is {float(source.table[r, i])}; the "
            "codecs take finite values only"
        )
    return source
