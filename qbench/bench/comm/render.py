"""Collective benchmark results for people: per backend x world size x network, an nccl-tests
style table (one section per scheme + compressor, one line per size), a speedup table over fp32
allreduce with the crossover size, then the targets; and ``qbench bench comm`` itself (measure,
show, write the JSON), so the measuring module never imports the one that shows it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from qbench.bench import comm
from qbench.bench.comm import (
    CommResult,
    CommRow,
    Speedup,
    TargetResult,
    crossovers,
    speedups,
    targets,
)
from qbench.bench.render import err, nbytes, out, seconds
from qbench.errors import UserError
from qbench.records.store import atomic_write_json

Group = tuple[str, int, str]  # backend, world size, network

_COLUMNS = (
    "scheme",
    "compressor",
    "size",
    "time",
    "algbw GB/s",
    "busbw GB/s",
    "wire",
    "wire busbw",
    "bits/value",
    "rel_error",
)


def _groups(rows: Sequence[CommRow]) -> list[Group]:
    return list(dict.fromkeys((r.backend, r.world_size, r.network) for r in rows))


def rows_table(rows: Sequence[CommRow], title: str) -> Table:
    t = Table(title=title)
    for col in _COLUMNS:
        t.add_column(col, justify="left" if col in ("scheme", "compressor") else "right")
    combos = list(dict.fromkeys((r.scheme, r.compressor) for r in rows))
    for scheme, comp in combos:
        mine = sorted(
            (r for r in rows if (r.scheme, r.compressor) == (scheme, comp)), key=lambda r: r.bytes
        )
        for r in mine:
            err_text = f"{r.rel_error:.2g}" + (" (simulated)" if r.simulated else "")
            t.add_row(
                r.scheme,
                r.compressor,
                nbytes(r.bytes),
                seconds(r.time_s),
                f"{r.algbw_GBps:.3g}",
                f"{r.busbw_GBps:.3g}",
                nbytes(r.wire_bytes),
                f"{r.wire_busbw_GBps:.3g}",
                f"{r.bits_per_value:.3g}",
                err_text,
            )
        t.add_section()
    return t


def speedup_table(ups: Sequence[Speedup], title: str) -> Table:
    """One line per scheme + compressor, one column per size, then the crossover size."""
    sizes = sorted({u.bytes for u in ups})
    t = Table(title=title)
    t.add_column("scheme")
    t.add_column("compressor")
    for s in sizes:
        t.add_column(nbytes(s), justify="right")
    t.add_column("crossover", justify="right")
    cross = crossovers(ups)
    for key, c in cross.items():
        by_size = {
            u.bytes: u.speedup
            for u in ups
            if (u.backend, u.world_size, u.network, u.scheme, u.compressor) == key
        }
        cells = [f"{by_size[s]:.2f}" if s in by_size else "" for s in sizes]
        t.add_row(key[3], key[4], *cells, crossover_text(c))
    return t


def crossover_text(size: int | None) -> str:
    return "never" if size is None else f">= {nbytes(size)}"


def target_line(t: TargetResult) -> str:
    verdict = "PASS" if t.passed else "MISS"
    comm = "n/a, phases overlap" if math.isnan(t.comm_only) else f"{t.comm_only:.2f}x"
    pays = (f"compression pays from {nbytes(t.crossover)} up" if t.crossover is not None
            else "compression does not pay at the largest size measured")  # fmt: skip
    return (
        f"target: {t.target.describe()}; {t.backend} {t.scheme}: ideal 32/{t.bits_per_value:.4g} = "
        f"{t.ideal:.2f}x, measured {t.measured:.2f}x = {t.fraction:.0%} of ideal {verdict} "
        f"(comm phase alone {comm}); the link (fp32 allreduce's wire rate "
        f"{t.link_GBps * 8:.3g} Gbit/s) carries its {nbytes(t.wire_bytes)} in "
        f"{t.link_s * 1e3:.3g} ms, {t.link_fraction:.0%} of its {t.time_s * 1e3:.3g} ms; {pays}"
    )


def show(result: CommResult) -> None:
    """Print the tables and target lines; notes and failures on stderr."""
    for note in result.notes:
        err.print(note, markup=False, highlight=False)
    s = result.settings
    ups = speedups(result.rows)
    for backend, k, net in _groups(result.rows):
        rows = [r for r in result.rows if (r.backend, r.world_size, r.network) == (backend, k, net)]
        head = f"{backend}, {k} ranks, {net}"
        how = "a barrier before each call" if s.sync == "barrier" else "calls back to back"
        if s.gap_ms:
            how += f", {s.gap_ms:g} ms busy before each"
        out.print(
            rows_table(
                rows,
                f"comm: {head}; median of {s.repeats} after {s.warmup} warm-up, {how}, max "
                "over ranks; busbw = fp32-equivalent",
            )
        )
        mine = [u for u in ups if (u.backend, u.world_size, u.network) == (backend, k, net)]
        if mine:
            out.print(speedup_table(mine, f"speedup over fp32 allreduce: {head}"))
    found = targets(result.rows)
    for t in found:
        out.print(target_line(t), markup=False, highlight=False)
    if not found:
        err.print(
            "targets: measured only with `--bandwidth 1gbit --world-size 2` at 64 MiB "
            "(e.g. `--max-bytes 64M`); none here",
            markup=False,
            highlight=False,
        )
    for f in result.failures:
        err.print(f"failed: {f}", markup=False, highlight=False)


def command(s: comm.Settings, json_path: Path | None) -> None:
    """``qbench bench comm``: measure, print the tables, optionally write the JSON."""
    result = comm.measure(s, lambda what: err.print(what, highlight=False, markup=False))
    show(result)
    if json_path is not None:
        atomic_write_json(json_path, comm.to_document(result))
        err.print(f"wrote {json_path}", highlight=False)
    if result.failures:
        raise UserError(f"{len(result.failures)} launch(es) failed: {'; '.join(result.failures)}")
