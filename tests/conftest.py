"""Session settings of the test suite.

Without a C compiler the sweeps in the tests would stop at the pre-flight ("compiled CPU
kernels: no C compiler"), as a user's would. The tests then sweep the torch codecs instead
(``QBENCH_COMPRESS_BACKEND=torch``, the fix that line names) and the tests of the compiled
kernels skip, saying so (tests/compiled.py); the header of the run says which. A backend set
by hand is left alone.

`make test` is one pytest-xdist session (``--dist loadgroup --no-loadscope-reorder``): the
multi-process tests (marked slow) of one file are meant to form one group, run by one worker,
and groups go out in collection order as workers come free. So the slow files go first, those
that take longest first (``LONGEST_FIRST``), and the single-process tests, handed out one at a
time, fill both workers to the end. Under pytest 9.2 the groups do not form: xdist marks a
group by rewriting the node id, which pytest 9.2 no longer reads (pytest-xdist issue 1386, fix
open), so a file's slow tests go out one at a time too and may run on both workers at once.
No test may count on a file's tests sharing a worker: test_netns.py once counted the other
worker's live namespaces as its own leftovers (three CI failures, 2026-11).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qbench.catalog import toolchain

_TORCH_CODECS = pytest.StashKey[bool]()

LONGEST_FIRST = (
    "test_scenarios_quick_rest.py", "test_group.py", "test_scenarios_quick.py",
    "test_resume.py", "test_failures.py", "test_ddp_exit.py", "test_netns.py", "test_async_ps.py",
    "test_cli.py", "test_slurm_nodes.py", "test_api.py", "test_resume_nodes.py",
    "test_interference_e2e.py", "test_ddp.py", "test_gossip.py", "test_slurm.py",
)  # fmt: skip
"""The slow files by their time in `make test` beside other work (2026-11-26, at 8dddf1a: about
260 s, 247, 225, 179, 111, 77, 68, 51, 46, 46, 45, 43, 41, 41, 41, 35); the rest keep their
order after."""


pytest_plugins = ["tests.compress.kernels.cuda.emulated"]  # the emulated kernels' fixtures


def pytest_configure(config: pytest.Config) -> None:
    if toolchain.find_c_compiler() is None and toolchain.BACKEND_ENV not in os.environ:
        os.environ[toolchain.BACKEND_ENV] = "torch"  # inherited by every sweep's subprocess
        config.stash[_TORCH_CODECS] = True
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if int(workers) > 1:
        _one_thread_each()


def _one_thread_each() -> None:
    """With several test workers, each computes on one thread, and so do the processes it
    starts (unless the caller chose a count): two workers of torch's default two threads on two
    cores spin-waited for each other. Measured: test_fidelity, test_gpt and test_lowfloat_kernels
    on two workers took 159 s of CPU and 128 s, 89 s and 83 s with one thread each. Tests of
    threading set their own counts (test_kernel_threads.py)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group(item.path.name))

    def order(item: pytest.Item) -> tuple[int, int]:
        slow = item.get_closest_marker("slow") is not None
        return (0 if slow else 1, rank.get(item.path.name, len(rank)))

    items.sort(key=order)  # stable: collection order kept within a file


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.stash.get(_TORCH_CODECS, False):
        return (
            f"no C compiler: sweeps use the torch codecs ({toolchain.BACKEND_ENV}=torch) and "
            "the compiled-kernel tests skip"
        )
    return None


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[Any]:
    """A one-rank gloo process group in this process (DDP and its hooks need one), as a
    qbench communicator; destroyed after the test."""
    import torch.distributed as dist

    from qbench.comm.torchdist import TorchDistComm

    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    try:
        yield TorchDistComm.attach()
    finally:
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _same_random_numbers() -> None:
    """Every test draws the same random numbers on every run, in any order and on any xdist
    worker: a test that fails in CI on unlucky data fails here too (a tensor drawn unseeded
    once made CI fail where the same test passed here). Tests that mean to vary seed their own
    generators."""
    import random

    import torch

    random.seed(0)
    torch.manual_seed(0)
