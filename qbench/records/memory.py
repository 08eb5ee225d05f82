"""Peak memory per rank: run.json's ``memory`` and the one rule that makes it a run's number.

Each rank measures its own peaks over the run (``qbench.run.memory``: from when the run starts,
before its model is built, to its last measured iteration) and writes
``parts/memory-<rank>.json``; the driver gathers them (:func:`combine`) into run.json's
``memory`` (schema version 3), ``{"ranks": [...]}``, one entry per rank:

* ``peak_rss_mib``: the most resident memory the rank's process held (the kernel's ``VmHWM``,
  reset when the run started), MiB. The whole process: the interpreter, torch and its libraries
  (several hundred MiB before any model) besides the run's model, optimizer, data and buffers;
  ``rss_start_mib`` is what the process held when the run started. None, with ``rss_note``
  saying why, where the peak could not be reset (it could then be an earlier run's);
* ``peak_gpu_mib``, ``peak_gpu_reserved_mib`` (CUDA runs only): the caching allocator's peak
  of memory handed out to tensors (``torch.cuda.max_memory_allocated``) and of memory it held
  from the device (``max_memory_reserved``), MiB; NCCL's buffers and the CUDA context are in
  neither;
* ``state_mib``: the training state the rank holds once the run ended: its parameters, their
  gradients and the optimizer's state (under FSDP its shards: about 1/K of DDP's), MiB, counted
  tensor by tensor, so it shows what RSS's hundreds of MiB of interpreter hide.

:func:`peaks` is the run's number for summaries: the largest over its ranks (the rank that
needs most sets what a machine must have), with how many ranks it rests on.
"""

from __future__ import annotations

from typing import Any

RSS, GPU, STATE = "peak_rss_mib", "peak_gpu_mib", "state_mib"
PEAKS = (RSS, GPU, STATE)
PEAK_COLUMNS = (*PEAKS, "peak_ranks")
"""A run's peaks (the largest over its ranks) and the number of ranks its RSS peak rests on."""


def combine(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """run.json's ``memory`` from the ranks' parts, by rank; None without parts."""
    if not parts:
        return None
    return {"ranks": sorted(parts, key=lambda p: int(p.get("rank", 0)))}


def peaks(memory: Any) -> dict[str, Any]:
    """``peak_rss_mib``, ``peak_gpu_mib``, ``state_mib``: the largest over the ranks that
    recorded one (None where none did: older records, CPU runs for the GPU); ``peak_ranks``:
    how many ranks recorded an RSS peak (None without a record)."""
    ranks = memory.get("ranks") if isinstance(memory, dict) else None
    if not isinstance(ranks, list):
        return dict.fromkeys(PEAK_COLUMNS)
    rss, gpu, state = (_values(ranks, k) for k in PEAKS)
    return {RSS: max(rss, default=None), GPU: max(gpu, default=None),
            STATE: max(state, default=None), "peak_ranks": len(rss)}  # fmt: skip


def _values(ranks: list[Any], key: str) -> list[float]:
    found = (r.get(key) for r in ranks if isinstance(r, dict))
    return [float(v) for v in found if isinstance(v, int | float) and not isinstance(v, bool)]
