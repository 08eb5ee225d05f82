"""The compute-utilization curve predicted from each scheme's declared traffic (issue 47).

A method that exchanges every H inner steps (DiLoCo and its family; H = 1 for DDP and every
per-step scheme) spends, per round of H steps on a link of B bit/s,

    wall(B) = H c + o + S max(0, T(B) - D c),  T(B) = sum over a sync's calls of
                                                      max(0, 8 w / B - burst)

* c: one inner step's compute, and o: the rest of a round's time that the link's rate does not
  set (codec, message latency, copies, the loop's own overhead), both measured on the method's
  own run over an unshaped link (loopback), where the transfer term is about nothing;
* w: each collective call's wire bytes per rank, from the catalog's declared traffic of the
  scheme's exchange (``qbench.catalog.schemes.traffic``; DDP: torch's ring allreduce of its
  fp32 or 16-bit buckets), for each of the round's S syncs: one, but Streaming DiLoCo sends
  its F fragments of n / F values in turn, S = F syncs of n / F values;
* D: the inner steps a sync's exchange runs behind (Streaming DiLoCo's delay; 0 for the rest),
  so that only what outlasts D steps of compute is exposed;
* burst: what an emulated link's token bucket passes at once (``formulas.burst_s``).

That last sum is the link at its full rate (``IDEAL``). Given a fitted cost model
(``qbench cost fit`` on ``qbench bench comm`` data), each phase is timed instead by the model's
alpha-beta fit of its collective on the nearest fitted rate, scaled (``FittedTransfer``): gloo's
alltoallv and allgatherv, which reduce-broadcast uses, run at about half the link's rate
(docs/results/comm.md), which the full-rate sum cannot know.

Utilization is H c / wall(B). Only the loopback run of each method is fitted here; every run on
a shaped link is held out and scored (``error`` = predicted / measured utilization - 1). Only
Streaming DiLoCo's delay hides transfer here: DDP's buckets do overlap backward, so its
predictions are a lower bound.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pandas as pd

from qbench.catalog import FP32, CompressorSpec
from qbench.catalog.schemes.traffic import ANY, Phase
from qbench.costmodel.formulas import burst_s, traffic
from qbench.costmodel.inputs import run_table
from qbench.costmodel.model import CostModel
from qbench.costmodel.phases import collective_fit
from qbench.costmodel.schemes import DDP, Scheme, is_torch_hook
from qbench.errors import UserError
from qbench.records.store import RUN_JSON, TIMELINE
from qbench.records.view import RunSpecs
from qbench.report import stats, utilization
from qbench.spec import layers
from qbench.spec.network import Link

METHOD = ("model", "backend", "world_size", "scheme", "compressor")
"""What one curve is: runs that differ only in their link (and seed or repeat)."""
COLUMNS = (
    *METHOD, "network", "bps", "H", "measured", "low", "high", "predicted", "error", "in_fit",
    "wire_round", "bytes_round",
)  # fmt: skip


class Transfer(Protocol):
    """Seconds one comm phase of a round takes on a link."""

    def __call__(self, phase: Phase, link: Link, tbf: bool = True) -> float: ...


def _ideal(phase: Phase, link: Link, tbf: bool = True) -> float:
    """Each call's bytes at the link's full rate, less its token bucket (``tbf``)."""
    if link.bits_per_s is None:
        return 0.0
    burst = burst_s(link) if tbf else 0.0
    return sum(max(0.0, 8 * w / link.bits_per_s - burst) for w in phase.calls)


IDEAL: Transfer = _ideal


@dataclass(frozen=True)
class FittedTransfer:
    """Each phase timed by the cost model's fit of its collective (``phases.collective_fit``)."""

    model: CostModel
    backend: str = "gloo"

    def __call__(self, phase: Phase, link: Link, tbf: bool = True) -> float:
        if link.bits_per_s is None:
            return 0.0  # loopback: in the fitted overhead
        fit, _ = collective_fit(self.model, self.backend, link, phase.collective)
        return fit.time(phase.msgs, phase.calls, link, tbf)


@dataclass(frozen=True)
class Round:
    """What a round of ``every`` inner steps sends: ``syncs`` exchanges of ``phases`` each, each
    run behind ``behind`` inner steps (Streaming DiLoCo's delay; 0: all of it exposed)."""

    every: int
    phases: tuple[Phase, ...]
    syncs: int = 1
    behind: int = 0


@dataclass(frozen=True)
class Curve:
    """One method's round: H inner steps of compute c, overhead o, and ``syncs`` exchanges of
    its comm phases, each behind ``behind`` inner steps."""

    every: int
    compute_s: float
    overhead_s: float
    phases: tuple[Phase, ...]
    syncs: int = 1
    behind: int = 0

    @property
    def wire(self) -> float:
        """Bytes one rank sends in a round (every phase one level, one lane: ``round_phases``)."""
        return self.syncs * sum(p.wire for p in self.phases)

    def wall(self, link: Link, transfer: Transfer = IDEAL, tbf: bool = True) -> float:
        """Seconds of one round on ``link`` (unshaped: no transfer term)."""
        sent = sum(transfer(p, link, tbf) for p in self.phases)
        exposed = max(0.0, sent - self.behind * self.compute_s)
        return self.every * self.compute_s + self.overhead_s + self.syncs * exposed

    def utilization(self, link: Link, transfer: Transfer = IDEAL, tbf: bool = True) -> float:
        return self.every * self.compute_s / self.wall(link, transfer, tbf)

    def needed(self, target: float, transfer: Transfer = IDEAL) -> float | None:
        """The link rate (bit/s, a real link: no token bucket) reaching ``target``, found to
        0.1 % by bisection in log rate; None when even 1 Pbit/s does not (the overhead)."""
        low, high = 1e3, 1e15

        def reaches(bps: float) -> bool:
            link = Link(bps, f"{bps:g}bit")
            return self.utilization(link, transfer, tbf=False) >= target

        if not reaches(high):
            return None
        while high / low > 1.001:
            mid = math.sqrt(low * high)
            low, high = (low, mid) if reaches(mid) else (mid, high)
        return high


def round_phases(
    spec: RunSpecs, ranks: int, groups: list[tuple[CompressorSpec, int]], backend: str = "gloo"
) -> Round:
    """The round of a run's scheme, from the declared traffic of what it exchanges, for each
    layer group (compressor, values) the run aggregates on its own (``qbench.spec.layers``:
    small tensors travel in fp32): a sync holds every group's share of one fragment, which the
    run exchanges together; UserError for what the curve cannot time."""
    scheme, p = spec.scheme, spec.scheme.params
    periodic = scheme.entry.kind == "periodic"
    if periodic and p["within_node"] != "none":
        raise UserError(f"scheme {scheme.name}: the utilization curve has no two-level rounds")
    # the flat scheme that carries the exchange (DDP's buckets: torch's ring allreduce)
    exchange = Scheme(str(p["exchange"]) if periodic else scheme.name).exchange
    every, fragments = (int(p["H"]), int(p.get("fragments", 1))) if periodic else (1, 1)
    phases: list[Phase] = []
    for compressor, values in groups:
        wire = compressor.wire_bytes(values)
        if wire is None:
            raise UserError(f"compressor {compressor.label}: its bytes depend on the data")
        # each fragment's bytes per value are the whole group's
        bits = 8 * wire / values
        of = traffic(exchange, compressor, ranks, values / fragments, bits, backend)
        # one level, so one lane (only levelled phases share lanes): a call's bytes are a rank's
        if any(phase.level != ANY for phase in of.phases):
            raise UserError(f"scheme {scheme.name}: the curve has no two-level rounds")
        phases += list(of.phases)
    return Round(every, tuple(phases), fragments, int(p.get("delay", 0)) if periodic else 0)


def layer_groups(run_dir: Path, spec: RunSpecs, values: int) -> list[tuple[CompressorSpec, int]]:
    """The run's layer groups as ``qbench.spec.layers.plan`` makes them, from the parameters a
    replayed run's timeline names; one group of every value when it names none, and for DDP
    with torch's own hooks, which cast every bucket alike."""
    if spec.scheme.name == DDP and is_torch_hook(spec.compressor):
        return [(spec.compressor, values)]
    record = json.loads((run_dir / RUN_JSON).read_text())
    try:
        doc = json.loads((run_dir / TIMELINE).read_text())
        params = [(str(p["name"]), int(p["numel"])) for p in doc["params"]]
    except (OSError, ValueError, KeyError, TypeError):
        return [(spec.compressor, values)]
    policy = layers.LayerPolicy(**((record.get("spec") or {}).get("layers") or {}))
    if policy.overrides:
        raise UserError("layers.overrides: the utilization curve times the run's compressor only")
    groups = layers.plan(params, dict(spec.compressor.given), policy)
    # the plan names each group's compressor as a mapping: the run's own, or none (fp32)
    typed = {json.dumps(dict(spec.compressor.given), sort_keys=True): spec.compressor}
    return [(typed.get(json.dumps(g.compressor, sort_keys=True), FP32), g.numel) for g in groups]


@dataclass(frozen=True)
class Fitted:
    """A results directory's methods, each with its runs and the curve its unshaped run fits."""

    methods: list[tuple[dict[str, object], pd.DataFrame, Curve]]
    transfer: Transfer
    per_run: pd.DataFrame
    """Each run's measured utilization and interval (``report.utilization.per_run``)."""
    means: pd.DataFrame
    """Each run's mean compute, wall time and bytes sent per inner step."""


def fit(root: Path | str, transfer: Transfer = IDEAL) -> Fitted:
    """Per method (``METHOD``) with an unshaped run of a known scheme: its curve, its phases
    timed by ``transfer``."""
    table = run_table(root)
    if table.empty:
        raise UserError(f"{root}: no ok runs with measured iterations")
    per_it = stats.per_iteration(stats.load(root).iterations)
    means = per_it.groupby("run_id")[["t_compute", "t_iteration", "bytes_sent"]].mean()
    methods = []
    for key, runs in table.groupby(list(METHOD), sort=True):
        fitted = runs[[link.bits_per_s is None for link in runs["link"]]]
        if fitted.empty or fitted.iloc[0]["specs"] is None:
            continue
        first = fitted.iloc[0]
        values = int(first["grad_bytes"]) // 4  # fp32 gradients: the model's parameters
        groups = layer_groups(Path(root) / str(first["run_id"]), first["specs"], values)
        ranks, backend = int(first["world_size"]), str(first["backend"])
        r = round_phases(first["specs"], ranks, groups, backend)
        c = float(means.loc[fitted["run_id"], "t_compute"].mean())
        wall = float(means.loc[fitted["run_id"], "t_iteration"].mean())
        curve = Curve(r.every, c, r.every * (wall - c), r.phases, r.syncs, r.behind)
        methods.append((dict(zip(METHOD, key, strict=True)), runs, curve))
    return Fitted(methods, transfer, utilization.per_run(per_it).set_index("run_id"), means)


def check(fitted: Fitted) -> pd.DataFrame:
    """Every run of the fitted methods: measured utilization (with its interval) against the
    curve (``COLUMNS``); ``in_fit`` marks the unshaped runs the curves rest on."""
    out = []
    for method, runs, curve in fitted.methods:
        for r in runs.itertuples():
            link: Link = r.link
            got = fitted.per_run.loc[r.run_id]
            pred = curve.utilization(link, fitted.transfer)
            sent = fitted.means.loc[r.run_id, "bytes_sent"] * curve.every
            out.append({
                **method, "network": r.network, "bps": link.bits_per_s, "H": curve.every,
                "measured": got["utilization"], "low": got["low"], "high": got["high"],
                "predicted": pred, "error": pred / got["utilization"] - 1,
                "in_fit": link.bits_per_s is None, "wire_round": curve.wire,
                "bytes_round": sent,
            })  # fmt: skip
    return pd.DataFrame(out, columns=list(COLUMNS))


def needed(fitted: Fitted, targets: tuple[float, ...] = utilization.TARGETS) -> pd.DataFrame:
    """Per method, the link rate its curve needs for each target (``bps_50`` ...; NaN: never,
    the round's overhead alone keeps it below)."""
    out = []
    for method, _, curve in fitted.methods:
        row: dict[str, object] = dict(method)
        for t in targets:
            got = curve.needed(t, fitted.transfer)
            row[f"bps_{t * 100:g}"] = math.nan if got is None else got
        out.append(row)
    return pd.DataFrame(out)
