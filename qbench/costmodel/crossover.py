"""At which link rate does a configuration beat DDP fp32? (``qbench cost crossover``)

With t(c, r) the predicted iteration of configuration c on links of r bit/s (``predict``: beta
scales with 1 / r), the crossover rates are the roots of ``f(r) = t(config, r) - t(DDP fp32, r)``
over [``LOW_BPS``, ``HIGH_BPS``]: f is evaluated on ``GRID`` rates evenly spaced in log r, and
each sign change is refined by bisection on log r until the bracket is narrower than
``REL_TOL``. Without a sign change the configuration is faster at every rate of the range
(``always``) or slower at every one (``never in range``). The baseline runs the same workload,
world size, backend and host: scheme ``ddp``, compressor fp32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from qbench.costmodel.config import Config, on_link
from qbench.costmodel.model import CostModel
from qbench.costmodel.predict import predict
from qbench.costmodel.schemes import DDP, NONE, Scheme, full_precision
from qbench.errors import UserError
from qbench.spec import network

LOW_BPS, HIGH_BPS = 10e6, 400e9
"""The range searched: 10 Mbit/s .. 400 Gbit/s."""
GRID = 61
REL_TOL = 1e-6
ALWAYS, NEVER, CROSSES = "always", "never in range", "crossover"


@dataclass(frozen=True)
class Crossover:
    config: Config
    baseline: Config
    verdict: str
    """``crossover``, ``always`` (faster over the whole range) or ``never in range``."""
    rates_bps: tuple[float, ...]
    """Where the two predictions are equal (or jump past each other), lowest first."""
    faster_below: tuple[bool, ...]
    """Per crossover: the configuration is the faster one just below it."""
    points: tuple[tuple[float, float, float], ...]
    """(rate, predicted iteration, DDP fp32 iteration) at a few rates around the crossovers."""


def crossover(
    model: CostModel, cfg: Config, low: float = LOW_BPS, high: float = HIGH_BPS
) -> Crossover:
    """The crossover of ``cfg`` against DDP fp32 (formulas in the module docstring)."""
    if not 0 < low < high:
        raise UserError(f"the rate range must be 0 < low < high, got {low:g} .. {high:g} bit/s")
    base = replace(
        cfg, scheme=Scheme(DDP), compressor=NONE, bits_per_value=None, fp32_numel=0, overlap=None
    )
    if cfg.scheme.per_bucket(cfg.overlap).name == DDP and full_precision(cfg.compressor):
        raise UserError("the configuration is DDP fp32 itself; pick another scheme or compressor")

    def both(rate: float) -> tuple[float, float]:
        at = network.at_rate(rate)
        return (
            predict(model, on_link(cfg, at)).total_s,
            predict(model, on_link(base, at)).total_s,
        )

    def diff(log_rate: float) -> float:
        mine, theirs = both(math.exp(log_rate))
        return mine - theirs

    lo, hi = math.log(low), math.log(high)
    grid = [lo + (hi - lo) * i / (GRID - 1) for i in range(GRID)]
    values = [diff(x) for x in grid]
    roots, below = [], []
    for i in range(GRID - 1):
        a, b, fa, fb = grid[i], grid[i + 1], values[i], values[i + 1]
        if (fa < 0) != (fb < 0):
            roots.append(math.exp(_bisect(diff, a, b, fa)))
            below.append(fa < 0)
    verdict = CROSSES if roots else ALWAYS if values[0] < 0 else NEVER
    points = tuple((r, *both(r)) for r in _around(roots, low, high))
    return Crossover(cfg, base, verdict, tuple(roots), tuple(below), points)


def _bisect(f: Callable[[float], float], a: float, b: float, fa: float) -> float:
    """A root of f in [a, b] (f(a) = fa and f(b) differ in sign), to ``REL_TOL`` in log rate."""
    while b - a > REL_TOL:
        mid = (a + b) / 2
        fm = f(mid)
        if (fm < 0) == (fa < 0):
            a, fa = mid, fm
        else:
            b = mid
    return (a + b) / 2


def _around(roots: list[float], low: float, high: float) -> list[float]:
    """Rates to show: each crossover and x1/4, x1/2, x2, x4 of it; else every decade."""
    if roots:
        want = {r * f for r in roots for f in (0.25, 0.5, 1.0, 2.0, 4.0)}
    else:
        want = {low, high, *(10.0**e for e in range(7, 13))}
    return sorted(r for r in want if low <= r <= high)


def check_rate(text: str, option: str) -> float:
    """bit/s of a rate option like ``10mbit`` (UserError naming the option otherwise)."""
    try:
        bps = network.link({"bandwidth": text}).bits_per_s
    except UserError:
        raise UserError(f"{option} must be a rate in kbit/mbit/gbit, got {text!r}") from None
    assert bps is not None  # a bandwidth key always gives a rate
    return bps
