"""How often a DDP training script aborts at exit: README's hook example (``hook``) and the same
script with DDP's own allreduce and no qbench (``plain``), each launched N times under
``torchrun --standalone --nproc-per-node 2`` (tests/ddp_exit_prog.py), the variants interleaved,
optionally beside a busy loop (``--busy``: the shared machine's other work, one core).

    .venv/bin/python benchmarks/ddp_exit.py --launches 20 --busy

The abort this counts is "terminate called without an active exception" (SIGABRT) after
training finished: gloo's worker thread releasing a finished collective's Python objects after
the interpreter began finalizing (pytorch/pytorch#190489; qbench.ddp.scheme_hook).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROG = ROOT / "tests" / "ddp_exit_prog.py"
BUSY = "while True: pass"


@contextmanager
def busy(on: bool) -> Iterator[None]:
    proc = subprocess.Popen([sys.executable, "-c", BUSY]) if on else None
    try:
        yield
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def launch(variant: str) -> tuple[int, bool]:
    """One torchrun launch: its exit code and whether a rank aborted."""
    args = [] if variant == "hook" else ["plain"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(PROG), *args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return proc.returncode, "terminate called without an active exception" in proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--variants", nargs="+", default=["hook", "plain"], choices=["hook", "plain"])
    ap.add_argument("--busy", action="store_true", help="a busy loop beside the launches")
    a = ap.parse_args()
    failed = {v: 0 for v in a.variants}
    aborted = dict(failed)
    with busy(a.busy):
        for i in range(a.launches):
            for v in a.variants:
                rc, abort = launch(v)
                failed[v] += rc != 0
                aborted[v] += abort
            print(f"launch {i + 1}/{a.launches}: " + ", ".join(
                f"{v} {failed[v]} failed" for v in a.variants), flush=True)  # fmt: skip
    for v in a.variants:
        print(f"{v}: {failed[v]} of {a.launches} launches failed, {aborted[v]} with the abort")


if __name__ == "__main__":
    main()
