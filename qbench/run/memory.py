"""A rank's peak memory over one run, measured for every run (``qbench.records.memory`` says
what the numbers mean and how the driver gathers them).

:class:`Peak` resets the peaks when a run starts, before its model is built, and
:meth:`Peak.write` reads them once the run ended (after its last measured iteration, or where
it failed) into ``parts/memory-<rank>.json``. Neither touches the timed loop.

* Resident memory: the kernel's high-water mark ``VmHWM`` in ``/proc/self/status``, reset by
  writing ``5`` to ``/proc/self/clear_refs`` (Linux 4.0 and later). Without the reset it is the
  process's peak, so in a warm rank group (``qbench.run.group``) every run would inherit the
  largest earlier run's; ``getrusage``'s ``ru_maxrss`` reads the same mark (the reset clears it
  too: Linux 6.18) and has no reset of its own. Where the reset fails no peak is recorded, and
  ``rss_note`` says why. The mark counts pages made resident: memory an earlier run of a warm
  group freed but the allocator kept resident serves a later run without raising it, so a warm
  run's peak can read lower than the same run's launched alone.
* On a GPU, the caching allocator's peaks (``torch.cuda.reset_peak_memory_stats`` at the start,
  ``max_memory_allocated`` and ``max_memory_reserved`` at the end) of the run's device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from qbench.records.memory import GPU, RSS, STATE
from qbench.records.store import atomic_write_json, memory_part

PROC_SELF = Path("/proc/self")
RESET_HWM = "5"  # clear_refs: "reset the peak resident set size" (proc(5))


def status_mib(text: str, field: str) -> float:
    """A ``kB`` field of ``/proc/self/status`` (``VmHWM``, ``VmRSS``) in MiB."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0]) / 1024
    raise ValueError(f"/proc/self/status has no {field}")


def reset_rss_peak(proc: Path = PROC_SELF) -> str | None:
    """Reset this process's ``VmHWM`` to its resident memory now; None when done, else why
    not (the peak read later would then be the process's, not the run's)."""
    try:
        (proc / "clear_refs").write_text(RESET_HWM)
        status_mib((proc / "status").read_text(), "VmHWM")
    except (OSError, ValueError) as e:
        return f"cannot reset the resident peak ({type(e).__name__}: {e})"
    return None


class Peak:
    """Start it where the run starts; :meth:`write` where it ends. ``device``: the run's."""

    def __init__(self, parts: Path, rank: int, device: torch.device, proc: Path = PROC_SELF):
        self.parts, self.rank, self.device, self.proc = parts, rank, device, proc
        self.note = reset_rss_peak(proc)
        self.start = None if self.note else self._rss("VmRSS")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def _rss(self, field: str) -> float:
        return round(status_mib((self.proc / "status").read_text(), field), 1)

    def read(self) -> dict[str, Any]:
        """The peaks since the start, MiB (``qbench.records.memory``'s keys)."""
        doc: dict[str, Any] = {"rank": self.rank, "rss_start_mib": self.start, RSS: None}
        if self.note is None:
            try:
                doc[RSS] = self._rss("VmHWM")
            except (OSError, ValueError) as e:
                self.note = f"cannot read the resident peak ({type(e).__name__}: {e})"
        if self.note is not None:
            doc["rss_note"] = self.note
        if self.device.type == "cuda":
            doc[GPU] = round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1)
            doc["peak_gpu_reserved_mib"] = round(
                torch.cuda.max_memory_reserved(self.device) / 2**20, 1
            )
        return doc

    def write(self, state_mib: float | None = None) -> None:
        """The peaks, with the training state the rank held at the end (``Training.state_mib``;
        None where the run has none, e.g. it failed before building it)."""
        doc = self.read()
        if state_mib is not None:
            doc[STATE] = round(state_mib, 3)
        atomic_write_json(memory_part(self.parts, self.rank), doc)
