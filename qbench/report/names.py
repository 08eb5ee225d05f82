"""Names for people: scheme, compressor and their parameters as figures, tables and pages show
them ("Choco-SGD, ring", "QSGD 4-bit, bucket 512", "DDP fp32", "QSGD 4-bit per DDP bucket").

The facts (what each parameter is called) are the catalog entries' ``display`` functions; this
module reads the labels a results directory stores (``run.json``: ``scheme``, ``compressor``),
turns them back into parameters (``catalog.from_label``, ``catalog.scheme_from_label``) and
composes the two. A label no entry makes (a plug-in's, or a file from a newer qbench) is shown
as it is. CSV files keep the machine labels; only what people read is renamed.
"""

from __future__ import annotations

from functools import lru_cache

from qbench import catalog
from qbench.catalog import rules
from qbench.errors import UserError

SIMULATED = " (simulated)"
"""The suffix ``stats`` puts on speed-only simulations' compressor labels; names keep it."""


def _split(label: object) -> tuple[str, str]:
    text = str(label)
    return (text.removesuffix(SIMULATED), SIMULATED) if text.endswith(SIMULATED) else (text, "")


@lru_cache(maxsize=4096)
def _compressor(label: str) -> catalog.CompressorSpec | None:
    try:
        return catalog.from_label(label)
    except UserError:
        return None


@lru_cache(maxsize=4096)
def _scheme(label: str) -> catalog.SchemeSpec | None:
    try:
        return catalog.scheme_from_label(label)
    except UserError:
        return None


def compressor(label: object, brief: bool = False) -> str:
    """``qsgd-4b-b512`` -> "QSGD 4-bit, bucket 512" (brief: "QSGD 4-bit")."""
    text, suffix = _split(label)
    spec = _compressor(text)
    return (text if spec is None else spec.display(brief)) + suffix


def scheme(label: object) -> str:
    """``gossip+algorithmchoco+topologyring`` -> "Choco-SGD, ring"."""
    spec = _scheme(str(label))
    return str(label) if spec is None else spec.display()


def method(scheme_label: object, compressor_label: object) -> str:
    """Scheme and compressor as one name: "DDP fp32", "QSGD 4-bit per DDP bucket",
    "Choco-SGD, ring · QSGD 4-bit", "allreduce · fp32"."""
    text, suffix = _split(compressor_label)
    what = compressor(text, brief=True)
    spec = _scheme(str(scheme_label))
    if spec is None:
        return f"{scheme_label} · {what}{suffix}"
    if spec.name == "ddp":
        return spec.display().replace("DDP", f"DDP {what}", 1) + suffix
    if rules.overlap(spec.name, spec.params) == "backward":
        rest = spec.display().split(" per DDP bucket", 1)[1]
        exchange = "" if spec.name == "reduce-broadcast" else f" ({spec.name})"
        return f"{what} per DDP bucket{exchange}{rest}{suffix}"
    return f"{spec.display()} · {what}{suffix}"
