"""One sweep per results directory: an exclusive ``flock`` on ``DIR/.qbench.lock``.

Two drivers writing the same directory would redo each other's runs and race on their files.
The lock belongs to the open file, so the kernel releases it when the holder exits in any way,
SIGKILL included: a killed sweep never leaves a stale lock behind, and the next one resumes.
The file holds the holder's pid, only to name it in the error; its presence means nothing.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from qbench.errors import UserError
from qbench.records.store import LOCK_FILE


@contextmanager
def sweep_lock(root: Path) -> Iterator[None]:
    """Hold ``root``'s lock for the block (creating ``root``); UserError when another holds it."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise UserError(
            f"results directory {root} cannot be written ({e.strerror or e}); use another --out"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise UserError(
                f"results directory {root} is in use by another qbench sweep "
                f"(pid {_holder(fd)}); wait for it or use another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # before the unlock: a pid in the file is always a live holder's
    finally:
        os.close(fd)  # releases the lock


def _holder(fd: int) -> str:
    """The holder's pid as it wrote it, or ``unknown`` (it may not have written it yet)."""
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"
