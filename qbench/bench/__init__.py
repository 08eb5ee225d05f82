"""Micro-benchmarks of single pieces (kernels, collectives), apart from sweeps.

Each benchmark is a pure measuring module returning rows (``kernels.py``), a renderer that
prints them for people (``render.py``) and a versioned JSON document written atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def kernels_command(
    specs: Sequence[str],
    sizes: Sequence[int],
    repeats: int,
    max_time: float,
    device: str,
    threads: int,
    backend: str,
    json_path: Path | None,
) -> None:
    """``qbench bench kernels``: measure, print the tables, optionally write the JSON."""
    from qbench.bench import kernels, render
    from qbench.records.store import atomic_write_json

    result = kernels.measure(
        specs or None,
        sizes=sizes,
        repeats=repeats,
        max_time=max_time,
        device=device,
        threads=threads,
        backend=backend,
        on_progress=lambda what: render.err.print(f"timing {what}", highlight=False),
    )
    render.show_kernels(result)
    if json_path is not None:
        atomic_write_json(json_path, kernels.to_document(result))
        render.err.print(f"wrote {json_path}", highlight=False)
