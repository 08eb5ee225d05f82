"""Third-party compressors and schemes, found through Python entry points (no torch here).

A package adds compressors or schemes to qbench without changing it, by declaring entry points
in its ``pyproject.toml``:

.. code-block:: toml

    [project.entry-points."qbench.compressors"]
    scaledsign = "mypkg.catalog:SCALED_SIGN"      # a CompressorEntry; its codec: "mypkg.codec:Cls"
    [project.entry-points."qbench.schemes"]
    decoded-mean = "mypkg.catalog:DECODED_MEAN"   # a SchemeEntry; its aggregator: "mypkg.agg:Cls"

An entry point's object is a ``CompressorEntry`` or ``SchemeEntry`` (or a list of them), whose
``codec`` / ``aggregator`` names the torch class as ``module:Class``: qbench imports that class
the first time a run, ``bench`` or a DDP hook builds it. Or it is a function of no arguments
that registers everything itself (``qbench.catalog.register_compressor`` +
``qbench.compress.register``, ``qbench.catalog.register_scheme`` + ``qbench.aggregate.register``).
The planner (``qbench sweep --dry-run``) imports the entry point's module, so keep that module
torch-free: entries there, codecs elsewhere (a registering function may import torch, but then
so does the planner).

Plug-ins load lazily, the first time a compressor or scheme table is read (:class:`Registry`),
in every process that looks names up: the sweep driver, each rank, ``bench`` workers, a script
using ``qbench.ddp``. A plug-in that fails to load does not stop qbench: ``qbench info`` lists
it with the error, and looking up one of its names says why it is missing.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qbench.catalog import importpath, registry
from qbench.catalog.compressors import COMPRESSORS, CompressorEntry
from qbench.catalog.schemes import SCHEMES, SchemeEntry
from qbench.errors import UserError

GROUPS = ("qbench.compressors", "qbench.schemes")


@dataclass(frozen=True)
class Loaded:
    """One entry point as loaded: what it registered, or why it could not."""

    group: str
    name: str
    value: str
    """``module:attr`` as the package declared it."""
    dist: str
    """The distribution that declared it, with its version."""
    registered: tuple[str, ...] = ()
    error: str = ""


LOADED: list[Loaded] = []
"""Every entry point seen, in load order (``qbench info`` lists them)."""
_state = {"loaded": False}


def load() -> None:
    """Load every entry point of :data:`GROUPS` once per process (later calls do nothing)."""
    if _state["loaded"]:
        return
    _state["loaded"] = True  # first: registering reads the tables, which calls load() again
    for group in GROUPS:
        for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
            LOADED.append(_load_one(group, ep))


def _load_one(group: str, ep: importlib.metadata.EntryPoint) -> Loaded:
    dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown package"
    try:
        obj = ep.load()
        names = register(obj)
    except Exception as e:  # a broken plug-in must not break qbench: reported, not raised
        text = str(e).splitlines()[0] if str(e) else ""
        return Loaded(group, ep.name, ep.value, dist, error=f"{type(e).__name__}: {text}")
    return Loaded(group, ep.name, ep.value, dist, registered=names)


def register(obj: Any) -> tuple[str, ...]:
    """Register a plug-in's object: an entry, a list of entries, or a registering function.
    Returns the names it added."""
    if isinstance(obj, CompressorEntry):
        importpath.check(obj.codec, f"compressor {obj.name}: codec")
        registry.add(COMPRESSORS, obj, "compressor")
        return (obj.name,)
    if isinstance(obj, SchemeEntry):
        importpath.check(obj.aggregator, f"scheme {obj.name}: aggregator")
        registry.add(SCHEMES, obj, "scheme")
        return (obj.name,)
    if isinstance(obj, list | tuple):
        return tuple(name for item in obj for name in register(item))
    if callable(obj):
        before = {*COMPRESSORS, *SCHEMES}
        obj()
        return tuple(sorted({*COMPRESSORS, *SCHEMES} - before))
    raise UserError(
        f"a qbench plug-in must be a CompressorEntry, a SchemeEntry, a list of them or a "
        f"function that registers them, got {type(obj).__name__}"
    )


def failures(names: Callable[[Loaded], bool] = lambda p: True) -> str:
    """``; plug-in X (pkg 1.0) failed to load: ...`` for the plug-ins that failed, to append to
    an "unknown name" error ("" when none failed)."""
    bad = [p for p in LOADED if p.error and names(p)]
    return "".join(f"; plug-in {p.name!r} ({p.dist}) failed to load: {p.error}" for p in bad)


def info_rows() -> list[tuple[str, str]]:
    """(what, status) rows for ``qbench info``: the compressors and schemes by name, and each
    plug-in with what it registered or why it failed."""
    rows = [
        ("compressors", ", ".join(COMPRESSORS)),
        ("schemes", ", ".join(SCHEMES)),
    ]
    for p in LOADED:
        what = p.group.removeprefix("qbench.").rstrip("s")
        status = (
            f"failed to load: {p.error}" if p.error
            else f"{what} {', '.join(p.registered) or '(nothing registered)'}"
        )  # fmt: skip
        rows.append((f"plug-in {p.name}", f"{status} ({p.value}, {p.dist})"))
    if not LOADED:
        rows.append(("plug-ins", f"none installed (entry points {', '.join(GROUPS)})"))
    return rows


# the tables (catalog.registry) load the plug-ins on first read; qbench.catalog imports this module,
# so the hook is in place before any table can be read
registry.before_first_read(load)
