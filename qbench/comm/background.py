"""Collectives run behind the caller: one helper thread on a duplicate communicator.

Streaming DiLoCo overlaps a fragment's exchange with the next ``delay`` inner steps (Douillard
et al., "Streaming DiLoCo with overlapping communication", 2025). The exchange's collectives
cannot share the loop's communicator: the loop may run its own collectives meanwhile (the
non-finite check, a node's gradient mean), and a collective library matches calls by their
order on a communicator. So the work goes to a duplicate, made collectively when the helper
starts, and to one thread that runs what is submitted in submission order: every rank submits
the same exchanges in the same order, so they match across ranks.

The duplicate counts its bytes apart (it has no parent): each task returns the bytes it sent,
and the caller records them itself (Streaming DiLoCo: on the step that started the exchange),
so that only the loop's thread ever writes the run's records. On a GPU each task runs on a
CUDA stream of its own, after the work the caller had queued when it submitted, and is
finished on the device when it returns.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

if TYPE_CHECKING:
    from qbench.comm.base import Comm

T = TypeVar("T")


def helper(comm: Comm) -> Background | None:
    """The helper beside ``comm``, started on first use and again after it was closed (a next
    run on the same ranks), shared by everything that asks meanwhile (the layer groups'
    exchanges, run in turn); collective: every rank asks in the same order. None where the
    backend cannot run collectives from a second thread."""
    made = _HELPERS.get(comm)
    if made is None or made.closed:
        made = Background.start(comm)
        if made is not None:
            _HELPERS[comm] = made
    return made


@dataclass(frozen=True)
class Done(Generic[T]):
    """A finished task: its value, the bytes it sent and the seconds it ran."""

    value: T
    bytes_sent: int
    seconds: float


class Background:
    """One helper thread and the duplicate communicator ``comm`` it alone uses."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._last: Future[Any] | None = None  # tasks run in order: when it is done, all are
        self._stream: torch.cuda.Stream | None = None  # made by the helper, on a GPU's first task
        # A daemon: a rank that failed with an exchange in flight must still exit (the task
        # may wait for peers that are gone); a run that ends well has waited for every task.
        self._thread = threading.Thread(target=self._serve, name="qbench-background", daemon=True)
        self._thread.start()
        self.closed = False

    @classmethod
    def start(cls, comm: Comm) -> Background | None:
        """A helper beside ``comm`` (collective: every rank calls it in the same order); None
        where the backend cannot run collectives from a second thread."""
        if not comm.threads:
            return None
        try:
            dup = comm.split(0)
        except NotImplementedError:
            return None
        dup.parent = None  # the caller adds its bytes (see the module's docstring)
        return cls(dup)

    def submit(self, fn: Callable[[], T], device: torch.device) -> Future[Done[T]]:
        """``fn()`` on the helper thread, after what the caller queued on ``device``; fn's
        collectives go to ``self.comm``."""
        ready = None
        if device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()  # on the caller's current stream: what fn must see done
        future: Future[Done[T]] = Future()
        self._last = future
        self._tasks.put(_Task(future, fn, device, ready))
        return future

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            if task.future.set_running_or_notify_cancel():
                try:
                    task.future.set_result(self._run(task))
                except BaseException as e:  # re-raised where the caller waits for it
                    task.future.set_exception(e)

    def _run(self, task: _Task) -> Done[Any]:
        begun, before = time.perf_counter(), self.comm.bytes_sent
        if task.ready is None:
            value = task.fn()
        else:
            if self._stream is None:
                self._stream = torch.cuda.Stream(task.device)
            self._stream.wait_event(task.ready)
            with torch.cuda.stream(self._stream):
                value = task.fn()
            self._stream.synchronize()
        return Done(value, self.comm.bytes_sent - before, time.perf_counter() - begun)

    def close(self) -> None:
        """Stop the thread once its tasks are done and release the communicator; with a task
        still in flight (a run that failed) leave both to the process's end."""
        if self.closed:
            return
        self.closed = True
        self._tasks.put(None)
        if self._last is None or self._last.done():
            self._thread.join()
            self.comm.close()


_HELPERS: weakref.WeakKeyDictionary[Comm, Background] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class _Task:
    future: Future[Any]
    fn: Callable[[], Any]
    device: torch.device
    ready: torch.cuda.Event | None
