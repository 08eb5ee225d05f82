"""Device time of QSGD's CUDA codec calls (issue 48): the one-pass kernels against the general
ones, side by side in one run, each as x its memory floor.

On a GPU machine, from the repository root:  python benchmarks/qsgd_kernels_gpu.py
(docs/results/qsgd-h200.txt is its output on a lent H200). Each call is timed as 20 calls queued
back to back behind a GPU sleep, so the host's launch cost does not show (median of 3). The
general kernels are reached through a view one float in (not 16-byte aligned) and codes one byte
in, which is what sends a call to them; the floor is the bytes a call must move (gradient in,
levels and scales out; decode the reverse, accumulate reading the output too) at the copy speed
measured the same way. ``vec`` as an argument times the one-pass kernels only.
"""

import statistics
import sys

import torch

sys.path.insert(0, ".")
from qbench.compress.kernels import cuda as kc  # noqa: E402
from qbench.compress.kernels.abi import QsgdFormat  # noqa: E402

N_CALLS = 20


def device_time(fn, calls=N_CALLS):
    """Seconds per call on the GPU: the calls are queued behind a sleep, so host launch cost
    does not show (back-to-back device time, launch gaps included)."""
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(40_000_000)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        runs.append(a.elapsed_time(b) * 1e-3 / calls)
    return statistics.median(runs)


def main():
    torch.manual_seed(0)
    big = torch.randn(2**26 + 4, device="cuda")
    dst = torch.empty_like(big)
    t = device_time(lambda: dst.copy_(big))
    bw = 2 * 4 * big.numel() / t
    print(f"copy: {bw / 1e12:.2f} TB/s (read + write)")
    rows = []
    for bits, bucket in ((2, 128), (4, 512), (8, 512), (16, 8192)):
        for norm, layout in (("max", "intervals"), ("l2", "intervals"), ("l2", "sign")):
            fmt = QsgdFormat(bits, bucket, layout, norm)
            for log2 in (24, 26):
                n = 2**log2
                nb = -(-n // bucket)
                lv_bytes, sc_bytes = (n * bits + 7) // 8, 4 * nb
                floors = {
                    "encode": (4 * n + lv_bytes + sc_bytes) / bw,
                    "decode": (lv_bytes + sc_bytes + 4 * n) / bw,
                    "decode+=": (lv_bytes + sc_bytes + 8 * n) / bw,
                }
                paths = (("vec", 0),) if "vec" in sys.argv else (("vec", 0), ("general", 1))
                for path, start in paths:
                    x = big[start : start + n]
                    out = torch.zeros(n + 1, device="cuda")[start : start + n]
                    levels, scales = kc.CUDA.qsgd_encode(x, fmt, key_hash=123, offset=7)
                    if start:  # codes one byte in: the general decode
                        moved = torch.empty(levels.numel() + 1, dtype=torch.uint8, device="cuda")
                        moved[1:].copy_(levels)
                        levels = moved[1:]
                    ops = {
                        "encode": lambda: kc.CUDA.qsgd_encode(x, fmt, key_hash=123, offset=7),
                        "decode": lambda: kc.CUDA.qsgd_decode(
                            levels, scales, n, fmt, out=out, accumulate=False
                        ),
                        "decode+=": lambda: kc.CUDA.qsgd_decode(
                            levels, scales, n, fmt, out=out, accumulate=True
                        ),
                    }
                    for op, fn in ops.items():
                        sec = device_time(fn)
                        rows.append(
                            (bits, bucket, norm, layout, log2, path, op, sec, sec / floors[op])
                        )
                        print(
                            f"qsgd {bits:>2}b b{bucket:<5} {norm:<3} {layout:<9} 2^{log2} "
                            f"{path:<7} {op:<8} {sec * 1e6:8.1f} us  x floor {sec / floors[op]:5.2f}",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
