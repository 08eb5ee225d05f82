"""The emulator's race detector (QBENCH_CUDA=racecheck): one launch under several schedules.

A GPU runs the threads of a block in any interleaving between barriers and the blocks of a grid
in any order, so a correct kernel writes the same bytes under every one. Each launch runs here
under SCHEDULES (threads in order, reversed, then seeded random interleavings with shuffled
blocks; kernels/emulate/cuda_emu_runtime.cpp), each on fresh copies of its tensor arguments,
and every schedule must leave the bytes the first one left. What that catches:

- a missing __syncthreads, or two threads or blocks writing one byte: the order decides;
- a read of shared memory nothing wrote: it starts with a different byte in each schedule;
- a read past the end (or before the start) of a tensor: each copy sits between guard bytes
  of a schedule-dependent value; a write there fails at once.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Protocol

import torch

from qbench.compress.kernels.cuda.args import Marshalled, c_type

SCHEDULES = (0, 1, 2, 3)
_NAMES = {0: "threads in order", 1: "threads and blocks reversed"}
_GUARD = 256  # bytes before and after each copy; a multiple of torch's 64-byte alignment


class _Runner(Protocol):
    def run(
        self, name: str, grid: int, block: int, smem: int, args: Marshalled, schedule: int = 0
    ) -> None: ...


def describe(schedule: int) -> str:
    return _NAMES.get(schedule, f"seeded random interleaving {schedule}")


def run(
    emu: _Runner,
    name: str,
    grid: int,
    block: int,
    smem: int,
    m: Marshalled,
    schedules: Sequence[int] = SCHEDULES,
) -> None:
    """Run the launch under every schedule; RuntimeError when their bytes differ."""
    launch = f"{name}<<<{grid}, {block}, {smem}>>>"
    regions = _regions(m)
    first: list[torch.Tensor] = []
    for schedule in schedules:
        copies = [_guarded(t, schedule) for t, _ in regions]
        values = list(m.values)
        for copy, (_, indices) in zip(copies, regions, strict=True):
            for i in indices:
                values[i] = (copy.data_ptr() + _GUARD).to_bytes(8, "little")
        # copies stay referenced here: the launch writes through their addresses
        emu.run(name, grid, block, smem, dataclasses.replace(m, values=values), schedule)
        results = [
            _unguard(copy, schedule, launch, m, indices)
            for copy, (_, indices) in zip(copies, regions, strict=True)
        ]
        if not first:
            first = results
            continue
        for got, want, (_, indices) in zip(results, first, regions, strict=True):
            _compare(got, want, schedule, launch, m, indices[0])
    for (t, _), result in zip(regions, first, strict=True):
        t.copy_(result)


def _regions(m: Marshalled) -> list[tuple[torch.Tensor, list[int]]]:
    """The distinct memory the tensors span (as bytes), with the arguments pointing into each."""
    regions: dict[tuple[int, int], tuple[torch.Tensor, list[int]]] = {}
    for i, t in m.tensors.items():
        flat = t.reshape(-1).view(torch.uint8)
        key = (flat.data_ptr(), flat.numel())
        regions.setdefault(key, (flat, []))[1].append(i)
    spans = sorted(regions)
    for (a, na), (b, _) in itertools.pairwise(spans):
        if na and b < a + na:
            raise TypeError("two tensor arguments overlap without being the same buffer")
    return list(regions.values())


def _poison(schedule: int) -> int:
    return (0xA5 + 0x3B * schedule) & 0xFF


def _guarded(t: torch.Tensor, schedule: int) -> torch.Tensor:
    buf = torch.full((_GUARD + t.numel() + _GUARD,), _poison(schedule), dtype=torch.uint8)
    buf[_GUARD : _GUARD + t.numel()] = t
    return buf


def _unguard(
    buf: torch.Tensor, schedule: int, launch: str, m: Marshalled, indices: list[int]
) -> torch.Tensor:
    n = buf.numel() - 2 * _GUARD
    for where, part in (("before", buf[:_GUARD]), ("after", buf[_GUARD + n :])):
        bad = (part != _poison(schedule)).nonzero()
        if bad.numel():
            i = indices[0]
            raise RuntimeError(
                f"{launch}: wrote {bad.numel()} bytes {where} argument {i} ({c_type(m.codes[i])}, "
                f"{n} bytes) under schedule {schedule} ({describe(schedule)})"
            )
    return buf[_GUARD : _GUARD + n].clone()


def _compare(
    got: torch.Tensor, want: torch.Tensor, schedule: int, launch: str, m: Marshalled, i: int
) -> None:
    diff = (got != want).nonzero()
    if not diff.numel():
        return
    k = int(diff[0])
    raise RuntimeError(
        f"{launch}: schedule {schedule} ({describe(schedule)}) left other bytes than schedule 0 "
        f"({describe(0)}) in argument {i} ({c_type(m.codes[i])}): {diff.numel()} bytes differ, "
        f"the first at byte {k} (0x{int(got[k]):02x}, not 0x{int(want[k]):02x}); a race between "
        "threads or blocks (a missing __syncthreads?), or a read of uninitialised shared memory "
        "or outside a buffer"
    )
