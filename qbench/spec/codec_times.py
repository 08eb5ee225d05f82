"""A ``qbench bench kernels --json`` document read without torch: its rows (the cost model
fits them, ``qbench.costmodel``) and each compressor's encode and decode time at any size, as
measured on the document's device (replayed codec time, ``qbench.run.replay.codec``), and the
break-even link rate those times give (the report page, ``qbench.report.page.breakeven``).
Documents from before the roofline (no ``roofline`` block or row key) read the same.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qbench import catalog
from qbench.errors import UserError
from qbench.spec import roofline

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
    wires: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    """Payload bytes measured per label and size (the rows' ``wire_bytes``): the payload of a
    compressor whose size depends on the data, for which the catalog has no count."""

    @classmethod
    def read(cls, path: str | Path, what: str = "codec_time") -> CodecTimes:
        """``what``: the key or option that named the file, for the error message."""
        p = Path(path)
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise UserError(
                f"{what}: {p} cannot be read ({type(e).__name__}); give a "
                "`qbench bench kernels --json` file"
            ) from None
        table: dict[tuple[str, str], dict[int, float]] = {}
        wires: dict[str, dict[int, int]] = {}
        for r in rows(doc, f"{what}: {p}"):
            label, numel = str(r["compressor"]), int(r["numel"])
            table.setdefault((label, str(r["op"])), {})[numel] = float(r["seconds"])
            if isinstance(r.get("wire_bytes"), int) and r["wire_bytes"] > 0:
                wires.setdefault(label, {})[numel] = r["wire_bytes"]
        points = {k: tuple(sorted(v.items())) for k, v in table.items()}
        measured = {k: tuple(sorted(v.items())) for k, v in wires.items()}
        return cls(source=str(p), device=device_name(doc), points=points, wires=measured)

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

    def wire_bytes(self, label: str, numel: int) -> int | None:
        """The payload bytes of ``numel`` values: the catalog's count (UserError for a label no
        entry makes), or for a payload whose size depends on the data the one measured at the
        nearest size, scaled to ``numel`` (its ratio kept); None where neither is known."""
        exact = catalog.from_label(label).wire_bytes(numel)
        if exact is not None:
            return exact
        measured = self.wires.get(label)
        if not measured:
            return None
        size, wire = min(measured, key=lambda p: abs(math.log(p[0] / numel)))
        return max(1, round(wire * numel / size))

    def breakeven(self, label: str, numel: int, overlap: float = 0.0) -> float | None:
        """B* in Gbit/s (``roofline.breakeven_of_times``): below this link rate ``label``'s
        codec, at this document's encode and decode times of ``numel`` values, costs less time
        than the bytes it saves, with a fraction ``overlap`` of the codec time hidden. None
        where compressing never pays (payload not smaller than fp32) or the payload is unknown."""
        wire = self.wire_bytes(label, numel)
        if wire is None:
            return None
        encode, decode = (self.seconds(label, op, numel) for op in OPS)
        return roofline.breakeven_of_times(numel, wire, encode, decode, overlap)


@functools.lru_cache(maxsize=8)
def read_once(path: str) -> CodecTimes:
    """``CodecTimes.read`` of a scenario's ``codec_time`` file, once per process (the planner
    asks for every run of the matrix)."""
    return CodecTimes.read(path)
