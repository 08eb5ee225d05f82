"""How ``qbench bench kernels`` times one codec: each encode and decode interleaved with a copy
of the same tensor and with torch's own casts (PEERS), so machine noise hits them alike.

Clocks: CUDA events on a GPU, perf_counter on the CPU. Every raw sample is returned; the rows
(``qbench.bench.kernels``) take medians after one warm-up of each call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from qbench import compress
from qbench.spec import codec_times

OPS = codec_times.OPS
PEERS = {"fp8 cast": torch.float8_e4m3fn, "bf16 cast": torch.bfloat16}
"""torch's casts timed beside every codec: encode is ``low.copy_(fp32)``, decode
``fp32.copy_(low)`` (torch's ``.to(dtype)`` without the allocation)."""


Clock = Callable[[Callable[[], object]], float]


PRIME_S = 200e-6
"""Seconds of GPU work queued before a timed call, so the device is still busy while the host
prepares the call's launches (Python, CuPy's argument conversion): the events then time the
device's work, as a training loop whose host runs ahead sees it, not the host's launch latency
(10-40 µs a codec call, most of a 2^20 copy). A call that waits for the GPU inside (a NaN check
read back) still pays its wait: the end event is queued only after the call returns."""


def describe(device_type: str) -> str:
    """How clock_for times calls on this kind of device, for the JSON and the docs."""
    if device_type == "cuda":
        return f"CUDA events after {PRIME_S * 1e6:g} µs of queued GPU work: device time"
    return "time.perf_counter around the call: wall time of the calling thread"


def clock_for(device: torch.device) -> Clock:
    """Seconds one call takes: CUDA events on a GPU (after PRIME_S of queued work), perf_counter
    on the CPU."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        hz = getattr(props, "clock_rate", 0) * 1e3  # reported in kHz
        cycles = int(PRIME_S * hz) if hz > 0 else 400_000

        def cuda_time(fn: Callable[[], object]) -> float:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            torch.cuda._sleep(cycles)  # busy while fn's launches are prepared
            start.record()
            result = fn()
            end.record()
            end.synchronize()
            del result
            return float(start.elapsed_time(end)) / 1e3

        return cuda_time

    def cpu_time(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        result = fn()  # kept alive until the clock is read: freeing it is not the kernel's cost
        t1 = time.perf_counter()
        del result
        return t1 - t0

    return cpu_time


def _prime(comp: compress.Compressor, src: torch.Tensor) -> None:
    """Same state before every timed encode: reset, then one encode so error feedback has a
    residual as in steady-state training (outside the timer)."""
    comp.reset()
    if comp.stateful:
        comp.encode(src, name="bench")


Samples = dict[str, list[float]]


def _peer_ops(src: torch.Tensor) -> dict[str, dict[str, Callable[[], object]]]:
    """Per op, each peer's call: torch's cast into a tensor made once, outside the timer."""
    ops: dict[str, dict[str, Callable[[], object]]] = {op: {} for op in OPS}
    back = torch.empty_like(src)
    for peer, dtype in PEERS.items():
        low = src.to(dtype)
        ops["encode"][peer] = partial(low.copy_, src)
        ops["decode"][peer] = partial(back.copy_, low)
    return ops


def samples(
    comp: compress.Compressor, src: torch.Tensor, repeats: int, max_time: float, clock: Clock
) -> tuple[Samples, list[float], dict[str, Samples], compress.Payload]:
    dst, values = torch.empty_like(src), torch.empty_like(src)
    _prime(comp, src)
    payload = comp.encode(src, name="bench")  # decode input, made once outside the timer
    decode = partial(comp.decode, payload, values, accumulate=False)
    peers = _peer_ops(src)
    clock(lambda: dst.copy_(src))  # warm-up
    clock(decode)
    for calls in peers.values():
        for call in calls.values():
            clock(call)
    _prime(comp, src)
    clock(lambda: comp.encode(src, name="bench"))
    times: Samples = {op: [] for op in OPS}
    copies: list[float] = []
    peer_times: dict[str, Samples] = {op: {p: [] for p in PEERS} for op in OPS}
    # Like pytest-benchmark's max_time: a codec far off the rest (a Python loop per bucket on a
    # GPU takes seconds a call) gets fewer repeats instead of eating the whole benchmark.
    deadline = time.perf_counter() + max_time
    for _ in range(repeats):
        _prime(comp, src)
        copies.append(clock(lambda: dst.copy_(src)))
        times["encode"].append(clock(lambda: comp.encode(src, name="bench")))
        times["decode"].append(clock(decode))
        for op, calls in peers.items():
            for peer, call in calls.items():
                peer_times[op][peer].append(clock(call))
        if time.perf_counter() > deadline:
            break
    return times, copies, peer_times, payload


def median(samples: list[float]) -> float:
    # An op that launches no work (fp32 aliases its input) can read 0 on a coarse clock; 1 ns
    # is below any clock's resolution and keeps GB/s and the ratio finite.
    return max(statistics.median(samples), 1e-9)
