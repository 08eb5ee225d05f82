"""Gradient compressors (the torch codecs) and their C / CUDA kernels.

Looked up by name: ``build("qsgd", bits=4)``. A plug-in's codec is imported from its catalog
entry's ``codec`` path the first time it is built.

To add an algorithm: its entry in ``qbench.catalog.compressors`` (parameters, label, wire
layout, capabilities), one module here with a Compressor subclass, and one line in COMPRESSORS
(docs/architecture.md).
"""

from __future__ import annotations

from typing import Any

from qbench import catalog
from qbench.catalog import importpath
from qbench.compress.adaptive import Adaptive
from qbench.compress.base import Compressor, Key, Payload, WireField
from qbench.compress.fixedpoint import FixedPoint
from qbench.compress.fp16 import BFloat16, Half
from qbench.compress.lowfloat import FP8, MX, NVFP4
from qbench.compress.none import NoCompression
from qbench.compress.onebit import OneBit
from qbench.compress.powersgd import PowerSGD
from qbench.compress.qsgd import QSGD
from qbench.compress.topk import TopK
from qbench.errors import UserError

__all__ = [
    "COMPRESSORS", "HOOK_COMPRESSORS", "Compressor", "Key", "Payload", "WireField", "build",
    "from_spec", "register",
]  # fmt: skip

COMPRESSORS: dict[str, type[Compressor]] = {
    c.name: c
    for c in (
        NoCompression,
        QSGD,
        OneBit,
        Half,
        BFloat16,
        FixedPoint,
        TopK,
        Adaptive,
        FP8,
        MX,
        NVFP4,
    )
}
"""The codecs (parameters, labels and rules: qbench.catalog.compressors)."""
# Not codecs but DDP communication hooks (scheme ddp): specified and validated like the codecs,
# never called to encode.
HOOK_COMPRESSORS: dict[str, type[Compressor]] = {PowerSGD.name: PowerSGD}
_ALL = {**COMPRESSORS, **HOOK_COMPRESSORS}


def register(codec: type[Compressor]) -> None:
    """Make a codec buildable by name; its facts must be in the catalog already
    (``qbench.catalog.register_compressor``)."""
    entry = catalog.COMPRESSORS.get(codec.name)
    if entry is None:
        raise UserError(
            f"codec {codec.name!r} has no catalog entry; register it first with "
            "qbench.catalog.register_compressor"
        )
    (HOOK_COMPRESSORS if entry.hook_only else COMPRESSORS)[codec.name] = codec
    _ALL[codec.name] = codec


def build(name: str, *, seed: int = 0, **params: Any) -> Compressor:
    """The codec registered as ``name`` with ``params``; bad input raises the catalog's
    UserError (unknown name or parameter, wrong type, a value out of range)."""
    return from_spec({"name": name, **params}, seed=seed)


def from_spec(spec: Any, *, seed: int = 0) -> Compressor:
    """Build from a validated ``catalog.CompressorSpec`` (a run's), or from a spec as a user
    writes it (``qsgd``, ``qsgd:bits=4``, ``{name: qsgd, bits: 4}``); ``seed`` is the run's."""
    checked = spec if isinstance(spec, catalog.CompressorSpec) else catalog.compressor(spec)
    return _codec(checked.entry)(seed=seed, spec=checked)


def _codec(entry: catalog.CompressorEntry) -> type[Compressor]:
    """The codec of ``entry``: registered, or imported from ``entry.codec`` the first time (a
    plug-in's, ``qbench.catalog.plugins``) and registered then."""
    if entry.name not in _ALL:
        cls = importpath.resolve(entry.codec, f"compressor {entry.name}: codec")
        if not (isinstance(cls, type) and issubclass(cls, Compressor)):
            raise UserError(
                f"compressor {entry.name}: codec {entry.codec!r} is not a "
                "qbench.compress.Compressor subclass; point it at the codec class"
            )
        if cls.name != entry.name:
            raise UserError(
                f"compressor {entry.name}: codec {entry.codec!r} is named {cls.name!r}; "
                f"set its `name` to {entry.name!r}"
            )
        register(cls)
    return _ALL[entry.name]
