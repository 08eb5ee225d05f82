"""When each DDP bucket was handed over and when its mean was ready: the overlap measurements.

A communication hook sees a bucket when DDP's reducer hands it over, i.e. when the last gradient
of that bucket has been computed by backward; the future it returns completes when the bucket's
mean is ready. From those two instants per bucket (host clock, ``time.perf_counter``):

* the end of backward compute is the last hand-over (the last bucket becomes ready when the
  last gradient that belongs to any bucket is computed);
* total communication time is the length of the union of the buckets' [hand-over, ready]
  intervals: time during which at least one bucket was being encoded, exchanged or decoded;
* exposed communication is what the training loop waited for after backward compute: from the
  last hand-over until ``backward()`` returned (DDP waits for every bucket there).

What it cannot see: on a GPU these are host times (a hook's future completes after the device
work; the kernels themselves may run later than their launch); the first iteration's buckets
follow parameter order until DDP rebuilds them in gradient-ready order; and time a bucket
spent queued in the reducer before hand-over counts as compute.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field


@dataclass
class BucketTimeline:
    """Hand-over and ready times of the buckets of one iteration (thread-safe: futures complete
    on communication threads)."""

    handed: dict[int, float] = field(default_factory=dict)
    ready: dict[int, float] = field(default_factory=dict)
    numel: dict[int, int] = field(default_factory=dict)
    payload: dict[int, int] = field(default_factory=dict)
    """Bytes of this rank's encoded bucket (as the iteration's payload_bytes, per bucket)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reset(self) -> None:
        with self._lock:
            for d in (self.handed, self.ready, self.numel, self.payload):
                d.clear()

    def hand_over(self, index: int, numel: int = 0) -> None:
        with self._lock:
            self.handed[index] = time.perf_counter()
            self.numel[index] = numel

    def add_payload(self, index: int, nbytes: int) -> None:
        with self._lock:
            self.payload[index] = self.payload.get(index, 0) + nbytes

    def done(self, index: int) -> None:
        with self._lock:
            self.ready[index] = time.perf_counter()

    def rows(self, origin: float) -> list[dict[str, float]]:
        """One row per bucket (``BUCKET_COLUMNS`` less run, rank and iteration), instants in
        seconds after ``origin`` (the end of the forward pass)."""
        with self._lock:
            return [
                {"bucket": i, "numel": self.numel.get(i, 0),
                 "payload_bytes": self.payload.get(i, 0), "t_handed": t - origin,
                 "t_ready": self.ready.get(i, math.nan) - origin}
                for i, t in sorted(self.handed.items())
            ]  # fmt: skip

    def last_hand_over(self) -> float:
        with self._lock:
            return max(self.handed.values(), default=math.nan)

    def comm_total(self) -> float:
        """Seconds during which at least one bucket was in flight."""
        with self._lock:
            spans = sorted((t, self.ready.get(i, t)) for i, t in self.handed.items())
        return union_length(spans)


def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length covered by the (start, end) intervals, overlaps counted once."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def overlap_fraction(exposed: float, total: float) -> float:
    """Share of communication time hidden behind backward compute, in [0, 1]; NaN without any
    communication."""
    if not total > 0:
        return math.nan
    return min(1.0, max(0.0, 1.0 - exposed / total))
