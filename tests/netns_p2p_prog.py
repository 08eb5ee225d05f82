"""Time point-to-point transfers from rank 0 to every other rank and write the rates as JSON
(tests/launch/test_netns.py: traffic inside an emulated node never crosses the shaper between
nodes).

usage: python tests/netns_p2p_prog.py BACKEND MIB REPEATS OUT_JSON
Rank 0 sends MIB to rank r and waits for a one-value reply, REPEATS times per peer, one peer
after the other (the others wait in a barrier); the best time per peer gives its rate.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from qbench import comm


def main() -> None:
    backend, mib, repeats, out = sys.argv[1:5]
    torch.set_num_threads(1)
    cm = comm.connect(backend, timeout_s=120)
    data, ack = torch.ones(int(float(mib) * 2**20) // 4), torch.zeros(1)
    gbit_s: dict[str, float] = {}
    for peer in range(1, cm.world_size):
        cm.barrier()
        best = float("inf")
        for _ in range(int(repeats)):
            if cm.rank == 0:
                t0 = time.perf_counter()
                cm.send(data, peer)
                cm.recv(ack, peer)
                best = min(best, time.perf_counter() - t0)
            elif cm.rank == peer:
                cm.recv(data, 0)
                cm.send(ack, 0)
        gbit_s[str(peer)] = data.numel() * 4 * 8 / best / 1e9
    if cm.rank == 0:
        Path(out).write_text(json.dumps({"gbit_s": gbit_s}))
    cm.barrier()
    cm.close()


if __name__ == "__main__":
    main()
