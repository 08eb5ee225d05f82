"""Seconds of each phase from the fits: a scheme's encode or decode (codec), and the collective
fit that times a comm phase on a link.

Each op is linear in the elements it touches, ``t = c0 + c1 * units``, fitted per (backend,
scheme, compressor, op) from the encode / decode phases of ``bench comm`` rows (and of sweep
runs), with ``units`` from the scheme's declared coding (``qbench.catalog.schemes.traffic``) so that
they scale with K. Without such a fit the phase is composed from ``bench kernels`` fits per
compressor: the coding's kernel calls on its units, plus its elementwise passes (divide,
zeroing) timed by ``copy``.

A collective key is timed by its fit on the link, else by the fit at the nearest link rate (log
scale; beta scaled, ``qbench.costmodel.formulas``), else by its fallback's (``FALLBACK``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from qbench import catalog
from qbench.catalog.schemes.traffic import Coding
from qbench.costmodel.config import Config
from qbench.costmodel.formulas import FALLBACK, coding
from qbench.costmodel.model import CodecFit, CollectiveFit, CostModel
from qbench.costmodel.schemes import FP32, Scheme, nominal_bits_per_value
from qbench.errors import UserError
from qbench.spec.network import Link


def _kernel(model: CostModel, compressor: str, op: str, device: str) -> CodecFit | None:
    for c in model.kernels:
        if c.compressor == compressor and c.op == op and c.device == device:
            return c
    return None


def codec_time(
    model: CostModel, backend: str, scheme: Scheme, compressor: str, k: int, n: float, op: str,
    device: str = "cpu", nodes: int = 0,
) -> tuple[float, list[str]]:  # fmt: skip
    """Seconds of a scheme's encode or decode phase for n values over K ranks (``nodes``: N
    nodes of K / N ranks, for a scheme whose traffic runs per level)."""
    if n <= 0:
        return 0.0, []
    return coded_time(model, backend, coding(scheme, k, n, op, nodes), compressor, op, device)


def coded_time(
    model: CostModel, backend: str, c: Coding, compressor: str, op: str, device: str = "cpu"
) -> tuple[float, list[str]]:
    """Seconds of one rank's coding ``c`` (``qbench.catalog.schemes.traffic``): the codec fits
    of the scheme that times it, else composed from kernel timings."""
    if c.values <= 0:
        return 0.0, []
    name = c.scheme
    fits = [p for p in model.phases if (p.scheme, p.compressor, p.op) == (name, compressor, op)]
    same = [p for p in fits if p.backend == backend]
    if same or fits:
        p = (same or fits)[0]
        notes = [] if same else [f"{op} of {name} {compressor} taken from {p.backend}"]
        return p.time(c.units), notes
    if _kernel(model, compressor, op, device) is not None or compressor == FP32:
        return _codec_from_kernels(model, c, compressor, op, device)
    # Last resort: the per-element cost another scheme measured for this compressor.
    other = [p for p in model.phases if (p.compressor, p.op) == (compressor, op)]
    if other and c.per_element:
        p = sorted(other, key=lambda p: (p.backend != backend, p.scheme))[0]
        return p.time(c.units), [f"{op} of {name} {compressor} per element from {p.scheme}"]
    return _codec_from_kernels(model, c, compressor, op, device)


def _codec_from_kernels(
    model: CostModel, c: Coding, compressor: str, op: str, device: str
) -> tuple[float, list[str]]:
    kern = _kernel(model, compressor, op, device)
    copy = _kernel(model, "", "copy", device)
    notes = [f"{op} of {c.scheme} {compressor} composed from kernel timings"]
    if kern is None:
        if compressor == FP32:
            return 0.0, [f"{op} of fp32 {c.scheme}: no timings, taken as 0"]
        raise UserError(
            f"no {op} timings for {compressor}: fit with `--kernels FILE.json` from `qbench "
            f"bench kernels --compressor ...` or with bench comm rows of {c.scheme} {compressor}"
        )
    pass_s = copy.time(c.values) if copy is not None else 0.0  # one elementwise pass
    if not catalog.SCHEMES[c.scheme].codec_calls:
        notes.append(f"{c.scheme} codec approximated by the {compressor} kernels")
    return kern.time(c.units, calls=c.calls) + c.passes * pass_s, notes


def collective_fit(
    model: CostModel, backend: str, link: Link, key: str
) -> tuple[CollectiveFit, list[str]]:
    """The fit for a collective on a link: the same key (scaled from the nearest rate if
    needed) first, then its fallbacks."""
    want, network = link.bits_per_s, link.label
    tried, notes = [], []
    k: str | None = key
    while k is not None:
        tried.append(k)
        fits = [c for c in model.collectives if c.backend == backend and c.collective == k]
        exact = [c for c in fits if c.network == network]
        chosen = exact[0] if exact else None
        if chosen is None and want is not None:
            chosen = _nearest([c for c in fits if c.bandwidth_bps is not None], want)
        if chosen is not None:
            if k != key:
                notes.append(f"{key} not fitted: {k} parameters stand in")
            if chosen.network != network:
                notes.append(f"{backend} {k} scaled from {chosen.network} to {network}")
            return chosen, notes
        k = FALLBACK.get(k)
    have = sorted({f"{c.backend}/{c.network}/{c.collective}" for c in model.collectives})
    raise UserError(
        f"no fit for {backend} {'/'.join(tried)} usable on {network} links (fitted: "
        f"{', '.join(have) or 'none'}); fit on `qbench bench comm --backend {backend}` data"
        + (" measured unshaped" if want is None else "")
    )


def _nearest(fits: Sequence[CollectiveFit], bps: float) -> CollectiveFit | None:
    """The fit whose link rate is nearest to ``bps`` in log scale."""
    best, best_d = None, math.inf
    for c in fits:
        d = abs(math.log((c.bandwidth_bps or bps) / bps))
        if d < best_d:
            best, best_d = c, d
    return best


def wire_bits(model: CostModel, cfg: Config) -> float:
    """Wire bits per value of the configuration's compressor: given, from its spec, else from
    the model's inputs."""
    if cfg.bits_per_value is not None:
        return cfg.bits_per_value
    bits = nominal_bits_per_value(cfg.compressor) or model.compressors.get(cfg.compressor.label)
    if bits is None:
        raise UserError(
            f"bits per value of {cfg.compressor.label} unknown: fit on bench data that includes it "
            "or give them"
        )
    return bits
