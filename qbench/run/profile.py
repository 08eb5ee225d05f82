"""Profiler traces of a run (``profile: true`` or ``qbench sweep --profile``): a torch.profiler
Chrome trace per rank of a few measured iterations, with the iteration's phases as named ranges
(open them in Perfetto, ``chrome://tracing`` or TensorBoard's profiler plugin).

Ranges: ``forward``, ``backward`` and ``step`` are opened by the training loops
(:func:`phase`, one call at each boundary, nothing to close); ``encode``, ``decode`` and
``comm`` wrap every codec call and collective while a trace is taken, wherever a scheme or a DDP
hook makes them (the DDP hooks' on their communication thread). Each is a ``record_function``
range, and an NVTX range on a GPU (Nsight Systems shows them too).

The profiler slows what it traces, so a profiled run is labelled ``profiled`` and reports keep
it out of speed summaries. Without ``profile`` nothing here runs in the timed loop but one
boolean test per :func:`phase` call.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from qbench.comm.base import Comm, Pending
from qbench.compress.base import Compressor

TRACED_ITERATIONS = 3
"""Measured iterations a trace covers (after one untraced iteration that warms the profiler)."""

_on = False
_nvtx = False
_open: list[Any] = []  # the range the loop opened last (record_function), at most one
_depth = threading.local()  # nested collectives (allgatherv -> alltoallv) count once


def phase(name: str | None) -> None:
    """Close the loop's current range and, with a name, open the next one (``forward``,
    ``backward``, ``step``; None: between phases)."""
    if not _on:
        return
    if _open:
        _open.pop().__exit__(None, None, None)
        if _nvtx:
            torch.cuda.nvtx.range_pop()
    if name is not None:
        rf = torch.autograd.profiler.record_function(name)
        rf.__enter__()
        _open.append(rf)
        if _nvtx:
            torch.cuda.nvtx.range_push(name)


@contextmanager
def _range(name: str) -> Iterator[None]:
    if _nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.autograd.profiler.record_function(name):
            yield
    finally:
        if _nvtx:
            torch.cuda.nvtx.range_pop()


def _wrapped(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, name, 0)
        if not _on or depth:
            return method(*args, **kwargs)
        setattr(_depth, name, 1)
        try:
            with _range(name):
                return method(*args, **kwargs)
        finally:
            setattr(_depth, name, 0)

    return call


_COLLECTIVES = (
    *("allreduce_", "iallreduce_", "alltoallv", "ialltoallv", "allgatherv", "iallgatherv"),
    *("send", "recv", "barrier"),
)


def _targets(comm: Comm) -> list[tuple[type, str, str]]:
    """(class, method, range name) of everything wrapped while tracing."""
    found: list[tuple[type, str, str]] = [(Pending, "wait", "comm")]
    for cls in _family(Compressor):  # codecs may override decode (qsgd, onebit)
        found += [(cls, m, m) for m in ("encode", "decode") if m in cls.__dict__]
    found += [(type(comm), m, "comm") for m in _COLLECTIVES if hasattr(type(comm), m)]
    return found


def _all_threads() -> Any:
    """Record every thread's ranges (DDP hooks encode and communicate on a thread of their
    own); torch versions without the option record the main thread's only."""
    try:
        return torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):
        return None


def _family(cls: type) -> list[type]:
    """``cls`` and every subclass defined so far."""
    out = [cls]
    sub: type
    for sub in cls.__subclasses__():
        out += _family(sub)
    return out


class Tracer:
    """The profiler of one rank's run; a no-op unless the spec asks for a trace."""

    def __init__(self, path: Path | None, warmup: int, measured: int, device: torch.device,
                 comm: Comm) -> None:  # fmt: skip
        self.path = path
        self._saved: list[tuple[type, str, Any]] = []
        self._prof: Any = None
        if path is None or measured < 1:
            return
        global _on, _nvtx
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        warm = 1 if measured > 1 else 0  # the profiler's own start-up, untraced
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=warmup, warmup=warm, active=min(
                TRACED_ITERATIONS, measured - warm), repeat=1),
            on_trace_ready=self._export, experimental_config=_all_threads(),
        )  # fmt: skip
        for cls, method, name in _targets(comm):  # classes, not instances: hooks build codecs
            original = cls.__dict__.get(method)
            self._saved.append((cls, method, original))
            setattr(cls, method, _wrapped(name, getattr(cls, method)))
        _on, _nvtx = True, device.type == "cuda"
        self._prof.start()

    def _export(self, prof: Any) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, self.path)

    def step(self) -> None:
        """After each iteration (warm-up included): the profiler's schedule advances."""
        if self._prof is not None:
            self._prof.step()

    def close(self) -> None:
        """Stop the profiler (a trace not yet written is written now) and unwrap."""
        global _on, _nvtx
        if self._prof is None:
            return
        phase(None)
        _on = _nvtx = False
        try:
            self._prof.stop()
        finally:
            for cls, method, original in reversed(self._saved):
                if original is None:
                    delattr(cls, method)
                else:
                    setattr(cls, method, original)
            self._prof = None
