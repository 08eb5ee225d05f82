"""A ``qbench bench kernels --json`` document read without torch: its rows (the cost model
fits them, ``qbench.costmodel``) and each compressor's encode and decode time at any size, as
measured on the document's device (replayed codec time, ``qbench.run.replay_codec``).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbench.errors import UserError

SCHEMA = "qbench.bench.kernels/1"
OPS = ("encode", "decode")
_NEED = ("compressor", "op", "numel", "seconds", "copy_seconds")


def rows(doc: Any, source: str) -> list[dict[str, Any]]:
    """The rows of a ``qbench bench kernels --json`` document (UserError if it is not one)."""
    return bench_rows(doc, source, SCHEMA, "qbench bench kernels", _NEED)


def bench_rows(
    doc: Any, source: str, schema: str, command: str, need: tuple[str, ...]
) -> list[dict[str, Any]]:
    """The rows of a ``COMMAND --json`` document of ``schema``, each holding the keys ``need``
    (UserError naming what is wrong otherwise); ``qbench bench comm``'s too."""
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        raise UserError(f"{source}: not a `{command} --json` file (schema {schema!r})")
    found = doc.get("rows")
    if not isinstance(found, list):
        raise UserError(f"{source}: has no rows list")
    for r in found:
        missing = [k for k in need if not isinstance(r, dict) or k not in r]
        if missing:
            raise UserError(f"{source}: a row lacks {', '.join(missing)}")
    return found


def device_name(doc: dict[str, Any]) -> str:
    """The device the document's times were measured on, in words: the GPU's name for
    ``--device cuda``, else the CPU's and the thread count."""
    machine = doc.get("machine") or {}
    if doc.get("device") == "cuda":
        gpus = (machine.get("gpus") or {}).get("devices") or [{}]
        return str(gpus[0].get("name") or "a CUDA GPU")
    return f"{machine.get('cpu') or 'a CPU'}, {doc.get('threads', 1)} thread(s)"


@dataclass(frozen=True)
class CodecTimes:
    """Median encode / decode seconds per compressor label at the measured sizes, and between
    them: linear in the element count between two measured sizes, the smallest size's time
    below it (a call's fixed cost dominates there) and proportional to the count above the
    largest (memory-bound)."""

    source: str
    device: str
    points: dict[tuple[str, str], tuple[tuple[int, float], ...]]

    @classmethod
    def read(cls, path: str | Path) -> CodecTimes:
        p = Path(path)
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise UserError(
                f"codec_time: {p} cannot be read ({type(e).__name__}); give a "
                "`qbench bench kernels --json` file"
            ) from None
        table: dict[tuple[str, str], dict[int, float]] = {}
        for r in rows(doc, f"codec_time: {p}"):
            table.setdefault((str(r["compressor"]), str(r["op"])), {})[int(r["numel"])] = float(
                r["seconds"]
            )
        points = {k: tuple(sorted(v.items())) for k, v in table.items()}
        return cls(source=str(p), device=device_name(doc), points=points)

    def has(self, label: str) -> bool:
        return all((label, op) in self.points for op in OPS)

    def labels(self) -> list[str]:
        return sorted({label for label, _ in self.points if self.has(label)})

    def seconds(self, label: str, op: str, numel: int) -> float:
        pts = self.points[(label, op)]
        sizes = [n for n, _ in pts]
        if numel <= sizes[0]:
            return pts[0][1]
        if numel >= sizes[-1]:
            return pts[-1][1] * numel / sizes[-1]
        i = bisect.bisect_left(sizes, numel)
        (n0, t0), (n1, t1) = pts[i - 1], pts[i]
        return t0 + (t1 - t0) * (numel - n0) / (n1 - n0)
