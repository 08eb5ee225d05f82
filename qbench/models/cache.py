"""On-disk cache of model statistics (parameter counts, FLOPs), so ``qbench models`` stays fast.

Counting FLOPs runs each model once on the meta device, which costs seconds for the whole zoo
(ResNet-152 alone takes most of one), and parameter counts need torchvision imported. The results
depend only on the model code and the torch/torchvision versions, so they are kept in
``$XDG_CACHE_HOME/qbench/model-stats.json`` (default ``~/.cache``) under a version stamp made of
those versions and the source of ``qbench/models/``; any change starts a fresh cache. Set
``QBENCH_NO_CACHE=1`` to bypass it. Unreadable or unwritable cache files are ignored.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

_memory: dict[str, dict[str, Any]] | None = None


def path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "qbench" / "model-stats.json"


def _enabled() -> bool:
    return os.environ.get("QBENCH_NO_CACHE", "") in ("", "0")


@functools.cache
def version() -> str:
    h = hashlib.sha1()
    for pkg in ("torch", "torchvision"):
        try:
            h.update(f"{pkg}={metadata.version(pkg)};".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{pkg}=?;".encode())
    for src in sorted(Path(__file__).parent.glob("*.py")):
        h.update(src.name.encode() + src.read_bytes())
    return h.hexdigest()[:16]


def _read() -> dict[str, dict[str, Any]]:
    try:
        doc = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != version():
        return {}
    stats = doc.get("stats")
    return stats if isinstance(stats, dict) else {}


def get(key: str, what: str) -> Any:
    """The cached ``what`` ("numel", "flops") of ``key``, or None."""
    global _memory
    if not _enabled():
        return None
    if _memory is None:
        _memory = _read()
    entry = _memory.get(key)
    return entry.get(what) if isinstance(entry, dict) else None


def put(key: str, what: str, value: Any) -> None:
    """Remember ``value``; merges with what other processes wrote meanwhile."""
    global _memory
    if not _enabled():
        return
    stats = _read()
    stats.setdefault(key, {})[what] = value
    _memory = stats
    target = path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".model-stats-", suffix=".json")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"version": version(), "stats": stats}, f, sort_keys=True)
        os.replace(tmp, target)  # atomic: readers see the old file or the new one
    except OSError:
        Path(tmp).unlink(missing_ok=True)
