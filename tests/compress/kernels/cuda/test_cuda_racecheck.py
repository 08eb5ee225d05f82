"""The emulator's race detector and launch checks catch the bugs they are for.

racy.cu, beside this file, holds small kernels, each with one classic GPU bug (and correct ones
to compare with); each test runs one through the emulator as QBENCH_CUDA=racecheck runs a launch
of qbench.compress.kernels.cuda, and requires the bug to be named. Both context switches are tested:
the x86-64 one and the portable ucontext one (-DEMU_UCONTEXT) that other machines use.
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
import torch

from qbench.compress.kernels.cuda import emulate as cuda_emulate
from qbench.compress.kernels.cuda import racecheck as cuda_racecheck
from tests import compiled

RACY = Path(__file__).with_name("racy.cu")
KERNELS = (
    "sum_ok",
    "sum_missing_sync",
    "pairs_share_a_byte",
    "blocks_share_a_word",
    "reads_uninitialised_shared",
    "reads_past_the_end",
    "writes_past_the_end",
    "shared_overrun",
    "divergent_barrier",
    "swap_neighbours",
    "count_atomic",
    "count_racy",
)
SWITCHES = ["native", "ucontext"] if platform.machine() == "x86_64" else ["ucontext"]


@pytest.fixture(scope="module", params=SWITCHES)
def emu(request: pytest.FixtureRequest) -> cuda_emulate.Emulator:
    try:
        defines = ("EMU_UCONTEXT",) if request.param == "ucontext" else ()
        return cuda_emulate.Emulator(cuda_emulate.build({str(RACY): KERNELS}, defines=defines))
    except RuntimeError as exc:  # skips without a C++ compiler; a broken build fails
        compiled.emulator_failed(exc)


def _racecheck(
    emu: cuda_emulate.Emulator,
    name: str,
    grid: int,
    block: int,
    args: tuple[object, ...],
    smem: int = 0,
    schedules: tuple[int, ...] = cuda_racecheck.SCHEDULES,
) -> None:
    cuda_racecheck.run(emu, name, grid, block, smem, emu.marshal(name, args), schedules)


def test_a_correct_reduction_passes(emu: cuda_emulate.Emulator) -> None:
    x, out = torch.arange(3 * 128, dtype=torch.float32), torch.zeros(3)
    _racecheck(emu, "sum_ok", 3, 128, (x, out), smem=4 * 128, schedules=tuple(range(12)))
    assert out.tolist() == [x[:128].sum(), x[128:256].sum(), x[256:].sum()]


def test_a_missing_syncthreads_is_caught(emu: cuda_emulate.Emulator) -> None:
    x, out = torch.ones(256), torch.zeros(2)
    emu.run("sum_missing_sync", 2, 128, 4 * 128, emu.marshal("sum_missing_sync", (x, out)))
    assert out.tolist() != [128.0, 128.0]  # wrong even in one schedule, but only by luck seen
    with pytest.raises(
        RuntimeError,
        match=r"sum_missing_sync<<<2, 128, 512>>>: schedule 1 .* argument 1 \(float \*\).*"
        "missing __syncthreads",
    ):
        _racecheck(emu, "sum_missing_sync", 2, 128, (x, out), smem=4 * 128)


def test_two_threads_writing_one_byte_are_caught(emu: cuda_emulate.Emulator) -> None:
    with pytest.raises(
        RuntimeError, match=r"pairs_share_a_byte.*schedule 1.*at byte 0 .0x00, not 0x01"
    ):
        _racecheck(emu, "pairs_share_a_byte", 1, 64, (torch.zeros(32, dtype=torch.uint8),))


def test_two_blocks_writing_one_word_are_caught(emu: cuda_emulate.Emulator) -> None:
    with pytest.raises(RuntimeError, match=r"blocks_share_a_word<<<4, 32, 0>>>: schedule 1"):
        _racecheck(emu, "blocks_share_a_word", 4, 32, (torch.zeros(1, dtype=torch.int32),))


def test_lost_updates_are_caught_and_atomics_pass(emu: cuda_emulate.Emulator) -> None:
    count = torch.zeros(1, dtype=torch.int32)
    _racecheck(emu, "count_atomic", 3, 64, (count,))
    assert count.item() == 192
    with pytest.raises(RuntimeError, match=r"count_racy.*schedule 2 .seeded random interleaving"):
        _racecheck(emu, "count_racy", 3, 64, (torch.zeros(1, dtype=torch.int32),))


def test_reads_of_uninitialised_shared_memory_are_caught(emu: cuda_emulate.Emulator) -> None:
    with pytest.raises(RuntimeError, match=r"reads_uninitialised_shared.*schedule 1.*at byte 0 "):
        _racecheck(emu, "reads_uninitialised_shared", 1, 32, (torch.zeros(32),), smem=128)


def test_reads_and_writes_past_a_buffer_are_caught(emu: cuda_emulate.Emulator) -> None:
    x, out = torch.ones(16), torch.zeros(16)
    with pytest.raises(
        RuntimeError, match=r"reads_past_the_end.*schedule 1.*argument 1 \(float \*\).*at byte 60 "
    ):
        _racecheck(emu, "reads_past_the_end", 1, 32, (x, out, np.int32(16)))
    with pytest.raises(
        RuntimeError, match=r"wrote 4 bytes after argument 0 \(float \*, 64 bytes\)"
    ):
        _racecheck(emu, "writes_past_the_end", 1, 32, (out, np.int32(16)))


def test_shared_memory_past_the_launchs_size_is_caught(emu: cuda_emulate.Emulator) -> None:
    args = emu.marshal("shared_overrun", (torch.zeros(32),))
    with pytest.raises(
        RuntimeError,
        match=r"shared_overrun: block 0, .*wrote shared memory at byte 128, past the 128 bytes",
    ):
        emu.run("shared_overrun", 1, 32, 128, args, 0)
    with pytest.raises(
        RuntimeError, match=r"49153 bytes of dynamic shared memory, more than the 49152"
    ):
        emu.run("shared_overrun", 1, 32, 49153, args, 0)


def test_a_barrier_in_divergent_code_is_a_deadlock(emu: cuda_emulate.Emulator) -> None:
    args = emu.marshal("divergent_barrier", (torch.zeros(64),))
    with pytest.raises(
        RuntimeError, match=r"deadlock: 63 of 64 threads wait at __syncthreads, 1 returned"
    ):
        emu.run("divergent_barrier", 1, 64, 0, args, 0)


def test_shuffles_need_every_lane_of_their_mask(emu: cuda_emulate.Emulator) -> None:
    out = torch.zeros(64, dtype=torch.int32)
    _racecheck(emu, "swap_neighbours", 1, 64, (out,))
    assert out.tolist() == [i ^ 1 for i in range(64)]
    args = emu.marshal("swap_neighbours", (out,))
    with pytest.raises(
        RuntimeError, match=r"mask 0xffffffff names lanes that do not exist .this warp has 16"
    ):
        emu.run("swap_neighbours", 1, 16, 0, args, 0)


def test_launch_configuration_limits(emu: cuda_emulate.Emulator) -> None:
    args = emu.marshal("sum_ok", (torch.zeros(2048), torch.zeros(1)))
    with pytest.raises(RuntimeError, match=r"2048 threads per block .1..1024."):
        emu.run("sum_ok", 1, 2048, 0, args, 0)
    with pytest.raises(RuntimeError, match=r"a grid of 0 blocks"):
        emu.run("sum_ok", 0, 32, 0, args, 0)
    with pytest.raises(RuntimeError, match=r"no kernel of that name"):
        emu.run("sum_nowhere", 1, 32, 0, args, 0)
