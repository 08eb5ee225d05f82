"""The DDP hook's communication thread ends with its state, its model and the process.

A daemon thread still inside torch's C++ code when Python shuts down aborts the process
("terminate called without an active exception"): README's hook example failed that way in
2 of 10 launches. The fast tests stop the thread every way it can end (``close()``, the state
collected, the model and process group gone, interpreter exit with a bucket in flight or stuck);
the slow test launches README's shape of script 8 times and wants exit code 0 every time.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import qbench.ddp
from qbench.ddp import scheme_hook
from qbench.launch import local
from tests.ddp_exit_prog import THREAD_ENDED, Busy, Stuck, plant, state
from tests.distributed import here
from tests.paths import ROOT

LAUNCHES = 8
"""The old failure (2 in 10) shows in 8 launches 5 times in 6 (1 - 0.8^8); each exit path is held
for certain by the fast tests above, so the suite spends 8 launches (about 80 s), not 20."""


def _thread(st: scheme_hook.SchemeHookState) -> threading.Thread:
    assert st._thread is not None and st._thread.is_alive()
    return st._thread


def test_close_stops_the_thread_after_its_bucket() -> None:
    st = state()
    agg = Busy(0.05)
    future = plant(st, agg)
    thread = _thread(st)
    assert agg.started.wait(5.0)
    st.close()
    assert not thread.is_alive()  # joined, not only told
    assert future.wait() is not None and agg.calls == 1  # the bucket in flight was finished


def test_a_collected_state_stops_its_thread() -> None:
    st = state()
    plant(st, Busy(0.0)).wait()
    thread = _thread(st)
    del st
    gc.collect()
    thread.join(5.0)
    assert not thread.is_alive()


def test_closing_fails_queued_buckets_and_waits_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheme_hook, "JOIN_TIMEOUT_S", 0.2)
    st = state()
    stuck, queued = Stuck(), Busy(0.0)
    plant(st, stuck)
    assert stuck.started.wait(5.0)
    later = plant(st, queued)
    thread = _thread(st)
    threading.Timer(10.0, stuck.release.set).start()  # a broken close() still returns
    t0 = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="still exchanging a bucket after 0.2 s"):
        st.close()
    assert time.perf_counter() - t0 < 5.0
    with pytest.raises(RuntimeError, match="hook closed: the bucket was not exchanged"):
        later.wait()
    assert queued.calls == 0  # no exchange started during teardown
    stuck.release.set()
    thread.join(5.0)
    assert not thread.is_alive()  # it took the stop after its bucket


def test_the_thread_ends_with_the_model_after_the_group_is_destroyed(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = DDP(nn.Linear(30, 2))
        st = qbench.ddp.register(model, "qsgd", bits=4, bucket_size=16)
        for _ in range(3):
            model(torch.randn(4, 30)).sum().backward()
        assert st.step == 3
        thread = _thread(st)
    finally:
        dist.destroy_process_group()
    del model, st
    gc.collect()
    thread.join(5.0)
    assert not thread.is_alive()


def _exit_during(kind: str, arg: float) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tests.ddp_exit_prog", kind, str(arg)]
    return subprocess.run(
        cmd, cwd=ROOT, env=local.worker_env(), capture_output=True, text=True, timeout=120
    )


def test_exit_waits_for_a_bucket_inside_torch_code() -> None:
    """Before the fix this aborted every time (rc -6, "terminate called ...")."""
    proc = _exit_during("busy", 0.5)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["main thread exits", THREAD_ENDED]


def test_exit_does_not_wait_for_a_stuck_bucket_forever() -> None:
    proc = _exit_during("stuck", 1.0)  # a hang would be the timeout of subprocess.run
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "still exchanging a bucket after 1 s" in proc.stderr
    assert proc.stdout.splitlines() == ["main thread exits"]  # left behind, as warned


def test_exit_lets_gloo_release_its_last_collective() -> None:
    """gloo's worker thread still holds the last collective when the main thread exits; with
    EXIT_GRACE_S = 0 most such exits abort (pytorch/pytorch#190489), so five in a row pass only
    with the exit hook's wait."""
    for _ in range(5):
        proc = _exit_during("release", 300_000)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.splitlines() == ["main thread exits"]


@pytest.mark.slow
@pytest.mark.timeout(LAUNCHES * 60)
def test_readme_shaped_script_exits_cleanly_every_time() -> None:
    """Each launch starts the two ranks as torchrun would (``env://``: rank, world size and a
    rendezvous port in their environment) without torchrun's own process, whose start (it
    imports torch) cost as much CPU as a rank's and plays no part in how a rank exits."""
    failed = []
    for i in range(LAUNCHES):
        codes, stderr = _launch_two_ranks()
        if codes != [0, 0]:
            failed.append(f"launch {i}: exit codes {codes}\n{_own_lines(stderr)}")
    assert not failed, f"{len(failed)} of {LAUNCHES} launches failed:\n" + "\n".join(failed)


def _launch_two_ranks() -> tuple[list[int], str]:
    env = {**local.worker_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(local.free_port()),
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}  # fmt: skip

    def rank(r: int) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, here("ddp_exit_prog.py")], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})  # fmt: skip

    ranks = [rank(0), rank(1)]
    try:
        errs = [p.communicate(timeout=120)[1] for p in ranks]
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    return [p.returncode for p in ranks], "\n".join(errs)


def _own_lines(stderr: str) -> str:
    """stderr without torchrun's info and warning lines ("W1126 10:18:03 ..."), so that the
    ranks' own ("terminate called without an active exception") show before its traceback."""
    lines = [line for line in stderr.splitlines() if not re.match(r"[DIW]\d{4} ", line)]
    return "\n".join(lines)[-3000:]
