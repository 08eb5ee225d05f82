"""How a training script with qbench's DDP hook ends (tests/ddp/test_ddp_exit.py).

usage: torchrun --standalone --nproc-per-node 2 tests/ddp_exit_prog.py [plain]
       (or two ranks started as torchrun starts them: RANK, WORLD_SIZE, MASTER_ADDR/PORT set)
       python tests/ddp_exit_prog.py busy SECONDS | stuck JOIN_TIMEOUT_S | release VALUES

With two ranks: a user's script in the shape of README's hook example, two gloo ranks, a tiny
model, the QSGD hook from ``comm_hook``, ``STEPS`` steps, ``dist.destroy_process_group()`` and a
normal exit with no ``close()`` (``plain``: the same script with DDP's own allreduce, no
qbench). ``busy``: one process whose hook thread is inside torch's C++
ops (the GIL released) for SECONDS when the main thread exits, where the race of a real run
leaves it now and then; ``stuck``: the thread's bucket never finishes, and exit may wait only
JOIN_TIMEOUT_S. Both print ``thread ended`` if the thread left its loop before Python shut down.
``release``: a one-rank gloo group whose last collective (an all-to-all of VALUES floats) is
still held by gloo's worker thread when the main thread exits, as a script's last bucket is
(pytorch/pytorch#190489; qbench.ddp.scheme_hook's exit hook).
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import qbench.ddp
from qbench.ddp import scheme_hook

STEPS = 60
THREAD_ENDED = "thread ended"


def main(hook: bool = True) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = DDP(nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4)))
    if hook:
        state, comm_hook = qbench.ddp.comm_hook("qsgd", bits=4, bucket_size=512)
        model.register_comm_hook(state, comm_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    if hook:
        assert state.step == STEPS, state.step  # every step went through the hook
    dist.destroy_process_group()


# -- a hook state on one in-process rank, with a stand-in aggregator ----------------------------
class Busy:
    """An aggregator that stays in torch's C++ ops for ``seconds`` (each op releases the GIL)."""

    payload_bytes = 0

    def metrics(self) -> dict[str, float]:  # what qbench.aggregate.Aggregator offers the hook
        return {}

    def __init__(self, seconds: float) -> None:
        self.seconds, self.started, self.calls = seconds, threading.Event(), 0

    def aggregate(self, values: torch.Tensor, step: int, timer: Any) -> torch.Tensor:
        self.calls += 1
        self.started.set()
        a, end = torch.ones(64), time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            a = torch.add(a, 1.0)
        return values


class Stuck(Busy):
    """An aggregator that waits until ``release`` is set (a peer that never answers)."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.release = threading.Event()

    def aggregate(self, values: torch.Tensor, step: int, timer: Any) -> torch.Tensor:
        self.calls += 1
        self.started.set()
        self.release.wait()
        return values


def state() -> scheme_hook.SchemeHookState:
    from tests.threadcomm import ThreadComm, _Shared  # needs the repository root on the path

    return scheme_hook.SchemeHookState(
        scheme="reduce-broadcast", comm=ThreadComm(_Shared(1), 0, 1), seed=0,
        spec_for=lambda p: {"name": "none"},
    )  # fmt: skip


def plant(st: scheme_hook.SchemeHookState, agg: Busy) -> torch.futures.Future[torch.Tensor]:
    """Hand the state's thread one 8-value bucket that ``agg`` exchanges; its future."""
    seg = scheme_hook.Segment(((0, 8),), {"name": "none"}, (8,))
    job = scheme_hook._Job(0, torch.zeros(8), [(seg, agg)], 0, torch.futures.Future())
    st._start()
    st._jobs.put(job)
    return job.future


def _report_thread_end() -> None:
    run = threading.Thread.run

    def reporting(self: threading.Thread) -> None:
        run(self)
        if self.name == "qbench-ddp-comm":
            print(THREAD_ENDED, flush=True)

    threading.Thread.run = reporting  # type: ignore[method-assign]


def exit_during(kind: str, seconds: float) -> None:
    _report_thread_end()
    agg: Busy = Busy(seconds) if kind == "busy" else Stuck()
    if kind == "stuck":
        scheme_hook.JOIN_TIMEOUT_S = seconds
    st = state()  # kept to the end, as README's example keeps its state
    plant(st, agg)
    agg.started.wait()
    print("main thread exits", flush=True)


def release_at_exit(values: int) -> None:
    store = tempfile.mkdtemp(prefix="qbench-exit-")
    dist.init_process_group("gloo", init_method=f"file://{store}/store", rank=0, world_size=1)
    st = state()  # a hook that has run, as in a training script
    plant(st, Busy(0.0)).wait()
    x = torch.randn(values)
    out = torch.empty_like(x)
    work = dist.all_to_all_single(out, x, async_op=True)
    del work, out, x  # gloo's worker thread now holds the collective's last references
    print("main thread exits", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "plain":
        main(hook=False)
    elif len(sys.argv) > 1 and sys.argv[1] == "release":
        release_at_exit(int(sys.argv[2]))
    elif len(sys.argv) > 1:
        exit_during(sys.argv[1], float(sys.argv[2]))
    else:
        main()
