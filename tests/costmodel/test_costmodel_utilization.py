"""The compute-utilization curve (qbench.costmodel.utilization): its arithmetic, the bytes a
round declares for each scheme, the layer groups it follows, and its check against runs held
out on shaped links, all by hand-computed cases."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from qbench import catalog
from qbench.catalog.schemes.traffic import Phase
from qbench.costmodel import utilization as u
from qbench.costmodel.model import CollectiveFit, CostModel
from qbench.errors import UserError
from qbench.records.schema import RunRecord, iterations_frame
from qbench.records.store import TIMELINE, ResultStore
from qbench.records.view import RunSpecs
from qbench.spec import network

FP32 = catalog.compressor("none")
MXFP4 = catalog.compressor({"name": "mx", "element": "e2m1"})


def specs(scheme: dict[str, object], compressor: catalog.CompressorSpec = FP32) -> RunSpecs:
    return RunSpecs(compressor, catalog.scheme(scheme), network.Link())


def _link(bps: float) -> network.Link:
    return network.Link(bps, f"{bps:g}bit")


def _phase(*calls: float, key: str = "allreduce", msgs: float = 2.0) -> Phase:
    return Phase(key, msgs, calls)


def test_a_round_is_h_steps_of_compute_its_overhead_and_its_bytes_at_the_link_rate() -> None:
    curve = u.Curve(every=10, compute_s=0.1, overhead_s=0.05, phases=(_phase(3e6, 3e6),))
    no_tbf = {"tbf": False}
    # 10 x 0.1 + 0.05 + 2 x 8 x 3e6 / 1e8 = 1.53 s
    assert curve.wall(_link(1e8), **no_tbf) == pytest.approx(1.53)
    assert curve.utilization(_link(1e8), **no_tbf) == pytest.approx(1.0 / 1.53)
    assert curve.utilization(network.Link()) == pytest.approx(1.0 / 1.05)  # no transfer term
    # the token bucket passes 2 ms of each call at once (tbf at 100 Mbit/s)
    assert network.tbf_burst_s(1e8) == pytest.approx(0.002)
    assert curve.wall(_link(1e8)) == pytest.approx(1.05 + 2 * (0.24 - 0.002))
    assert curve.wall(_link(1e12)) == pytest.approx(1.05)  # never below nothing
    # 50 %: 1 / 0.5 - 1 - 0.05 = 0.95 s for 48e6 bits
    assert curve.needed(0.5) == pytest.approx(48e6 / 0.95, rel=2e-3)
    assert curve.utilization(_link(curve.needed(0.9)), **no_tbf) == pytest.approx(0.9, rel=2e-3)
    assert curve.needed(0.99) is None  # 0.05 s of overhead per 1 s of compute: 95 % at most
    assert curve.wire == 6e6


def test_a_streaming_sync_hides_what_its_delay_steps_of_compute_cover() -> None:
    """H 4 steps of 0.1 s, 2 syncs of 1e6 bytes, each behind 1 inner step: at 100 Mbit/s a
    sync's 0.08 s hides under the step (wall 0.4 s); at 10 Mbit/s 0.8 - 0.1 = 0.7 s of each is
    exposed (wall 0.4 + 1.4 s). A round's declared delay is the scheme's."""
    curve = u.Curve(4, 0.1, 0.0, (_phase(1e6),), syncs=2, behind=1)
    assert curve.wall(_link(1e8), tbf=False) == pytest.approx(0.4)
    assert curve.wall(_link(1e7), tbf=False) == pytest.approx(1.8)
    assert curve.wire == 2e6
    streaming = specs({"name": "streaming-diloco", "H": 8, "fragments": 2, "delay": 3})
    r = u.round_phases(streaming, 4, [(FP32, 1000)])
    assert (r.every, r.syncs, r.behind) == (8, 2, 3)
    assert u.round_phases(specs({"name": "diloco", "H": 8}), 4, [(FP32, 1000)]).behind == 0


def test_a_fitted_model_times_each_phase_by_its_collective(tmp_path: Path) -> None:
    """alpha 1 ms a message step, beta of 50 Mbit/s fitted at 100 Mbit/s (half the rate): at
    10 Mbit/s beta scales to 5 Mbit/s."""
    fit = CollectiveFit(
        backend="gloo", network="100mbit", collective="alltoallv", alpha_s=1e-3,
        beta_s_per_byte=8 / 5e7, r2=1.0, points=3, rel_err_median=0.0, rel_err_max=0.0,
    )  # fmt: skip
    model = CostModel(collectives=[fit])
    transfer = u.FittedTransfer(model)
    phase = _phase(1e6, key="alltoallv", msgs=3.0)
    assert transfer(phase, _link(1e8)) == pytest.approx(3e-3 + 8e6 / 5e7)
    assert transfer(phase, _link(1e7)) == pytest.approx(3e-3 + 8e6 / 5e6)
    assert transfer(phase, network.Link()) == 0.0  # loopback: in the fitted overhead
    curve = u.Curve(every=1, compute_s=1.0, overhead_s=0.0, phases=(phase,))
    assert curve.utilization(_link(1e7), transfer) == pytest.approx(1 / (1 + 3e-3 + 1.6))
    # 50 % at 1.0 s of transfer: 3 ms + 8e6 / (rate / 2) = 1 s
    assert curve.needed(0.5, transfer) == pytest.approx(16e6 / 0.997, rel=2e-3)
    # a token bucket's credit counts on an emulated link only (tbf), never on a real one
    credited = u.FittedTransfer(CostModel(collectives=[replace(fit, credit_s=0.1)]))
    assert credited(phase, _link(1e8)) == pytest.approx(3e-3 + 0.16 - 0.002)  # the link's 2 ms
    assert credited(phase, _link(1e8), tbf=False) == pytest.approx(3e-3 + 0.16)


def calls(
    spec: RunSpecs, ranks: int, groups: list[tuple[catalog.CompressorSpec, int]]
) -> tuple[int, tuple[float, ...]]:
    r = u.round_phases(spec, ranks, groups)
    return r.every, tuple(w / p.lanes for p in r.phases for w in p.calls) * r.syncs


def test_each_scheme_declares_its_round_bytes() -> None:
    """4 ranks, 1000 fp32 values (4000 bytes): reduce-broadcast sends 3/4 of them to the owners
    and 3/4 in the gather; a ring allreduce 2 x 3/4; fragments send their share in turn."""
    groups = [(FP32, 1000)]
    diloco = specs({"name": "diloco", "H": 10, "exchange": "reduce-broadcast"})
    assert calls(diloco, 4, groups) == (10, (3000.0, 3000.0))
    streaming = specs({"name": "streaming-diloco", "H": 8, "fragments": 2, "delay": 1,
                       "exchange": "reduce-broadcast"})  # fmt: skip
    assert calls(streaming, 4, groups) == (8, (1500.0,) * 4)
    local = specs({"name": "local-sgd", "H": 4, "exchange": "allreduce"})
    assert calls(local, 4, groups) == (4, (6000.0,))
    assert calls(specs({"name": "ddp"}), 4, groups) == (1, (6000.0,))
    bf16 = catalog.compressor("bf16")
    assert calls(specs({"name": "ddp"}, bf16), 4, [(bf16, 1000)]) == (1, (3000.0,))
    # MXFP4: 17 bytes per 32 values (1024 values: 544 bytes), beside 40 fp32 values (160
    # bytes), each group its own exchange; over 2 ranks each phase sends half
    mixed = [(MXFP4, 1024), (FP32, 40)]
    rb = specs({"name": "diloco", "H": 2, "exchange": "reduce-broadcast"}, MXFP4)
    assert calls(rb, 2, mixed) == (2, (272.0, 272.0, 80.0, 80.0))


def test_rounds_the_curve_cannot_time_are_refused_with_the_reason() -> None:
    two_level = specs({"name": "diloco", "H": 10, "within_node": "allreduce"})
    with pytest.raises(UserError, match="two-level"):
        calls(two_level, 4, [(FP32, 1000)])
    adaptive = catalog.compressor("adaptive")
    with pytest.raises(UserError, match="depend on the data"):
        calls(specs({"name": "diloco", "H": 10}, adaptive), 4, [(adaptive, 1000)])


def _run_dir(tmp_path: Path, compressor: dict[str, object], scheme: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    spec = {"compressor": compressor, "scheme": scheme, "layers": {"full_precision_below": 100}}
    (run / "run.json").write_text(json.dumps({"spec": spec}))
    params = [{"name": f"w{i}", "numel": n} for i, n in enumerate((4096, 64, 1024, 32))]
    (run / TIMELINE).write_text(json.dumps({"params": params}))
    return run


def test_the_round_follows_the_runs_layer_groups(tmp_path: Path) -> None:
    """Tensors under ``full_precision_below`` travel in fp32 (seed 002's small tensors)."""
    mx = {"name": "mx", "element": "e2m1"}
    run = _run_dir(tmp_path, mx, "diloco")
    got = u.layer_groups(run, specs({"name": "diloco", "H": 2}, MXFP4), 5216)
    assert [(c.label, n) for c, n in got] == [("mxfp4", 5120), ("fp32", 96)]
    # DDP with torch's hooks casts every bucket alike: one group
    bf16 = catalog.compressor("bf16")
    assert u.layer_groups(run, specs({"name": "ddp"}, bf16), 5216) == [(bf16, 5216)]
    # the same cast outside DDP's hooks follows the plan
    got = u.layer_groups(run, specs({"name": "diloco", "H": 2}, bf16), 5216)
    assert [(c.label, n) for c, n in got] == [("bf16", 5120), ("fp32", 96)]
    record = json.loads((run / "run.json").read_text())
    record["spec"]["layers"]["overrides"] = {"w0": {"name": "bf16"}}
    (run / "run.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"^layers\.overrides: the utilization curve times the run"):
        u.layer_groups(run, specs({"name": "diloco", "H": 2}, MXFP4), 5216)
    (run / TIMELINE).unlink()  # no timeline (not replayed): one group
    assert u.layer_groups(run, specs({"name": "diloco", "H": 2}, MXFP4), 5216) == [(MXFP4, 5216)]


SCHEME = "diloco+H2+exchangereduce-broadcast"


def _sweep(root: Path) -> None:
    """DiLoCo H 2 over 2 ranks, 1000 fp32 parameters (no timeline: one group), on loopback and
    at 1 Mbit/s: compute 0.1 s a step; a round's exchange adds 0.02 s on loopback, 0.05 s at
    1 Mbit/s; 2 warm-up steps, 2 measured rounds."""
    store = ResultStore(root)
    for label, extra, sent in (("unshaped", 0.02, 2000), ("1mbit", 0.05, 2000)):
        setting = {} if label == "unshaped" else {"bandwidth": label}
        run_id = f"diloco-{label}"
        labels = {"model": "mlp", "backend": "gloo", "world_size": 2, "scheme": SCHEME,
                  "compressor": "fp32", "network": label, "seed": 0, "repeat": 0}  # fmt: skip
        spec = {"compressor": {"name": "none"}, "scheme": "diloco", "network": setting,
                "scheme_params": {"H": 2, "exchange": "reduce-broadcast"}}  # fmt: skip
        store.write_record(RunRecord(run_id=run_id, status="ok", labels=labels, spec=spec))
        rows = []
        for rank in range(2):
            for it in range(6):
                exchange = it % 2 == 1
                wall = 0.1 + (extra if exchange else 0.0)
                rows.append({
                    "run_id": run_id, "rank": rank, "iteration": it, "warmup": it < 2,
                    "t_compute": 0.1, "t_iteration": wall, "grad_bytes": 4000, "payload_bytes": 0,
                    "bytes_sent": sent if exchange else 0,
                })  # fmt: skip
        store.write_iterations(run_id, iterations_frame(rows))


def test_the_curve_fits_the_loopback_run_and_scores_the_shaped_one(tmp_path: Path) -> None:
    _sweep(tmp_path)
    fitted = u.fit(tmp_path)
    ((method, runs, curve),) = fitted.methods
    assert method["scheme"] == SCHEME and len(runs) == 2
    # c = 0.1, o = 2 x (0.11 - 0.1) = 0.02; reduce-broadcast over 2 ranks: 2000 + 2000 bytes
    assert curve.every == 2 and curve.compute_s == pytest.approx(0.1)
    assert curve.overhead_s == pytest.approx(0.02, abs=1e-12) and curve.wire == 4000.0
    got = u.check(fitted).set_index("network")
    assert got.loc["unshaped", "in_fit"] and not got.loc["1mbit", "in_fit"]
    assert got.loc["unshaped", "predicted"] == pytest.approx(0.2 / 0.22)
    burst = network.tbf_burst_s(1e6)
    want = 0.2 / (0.22 + 2 * max(0.0, 8 * 2000 / 1e6 - burst))
    assert got.loc["1mbit", "predicted"] == pytest.approx(want)
    assert got.loc["1mbit", "measured"] == pytest.approx(0.2 / 0.25)
    assert got.loc["1mbit", "error"] == pytest.approx(want / 0.8 - 1)
    assert got.loc["1mbit", "wire_round"] == 4000 and got.loc["1mbit", "bytes_round"] == 2000
    rates = u.needed(fitted)
    assert math.isnan(rates.loc[0, "bps_99"])  # 0.02 s of 0.22: 90.9 % at most
    assert rates.loc[0, "bps_50"] == pytest.approx(8 * 4000 / (0.2 / 0.5 - 0.2 - 0.02), rel=2e-3)
    # an exchange fitted at half the link's rate needs twice the rate for the same share
    half = CollectiveFit(
        backend="gloo", network="1mbit", collective="exchange", alpha_s=0.0,
        beta_s_per_byte=8 / 0.5e6, r2=1.0, points=3, rel_err_median=0.0, rel_err_max=0.0,
    )  # fmt: skip
    slow = u.needed(u.fit(tmp_path, u.FittedTransfer(CostModel(collectives=[half]))))
    assert slow.loc[0, "bps_50"] == pytest.approx(2 * rates.loc[0, "bps_50"], rel=3e-3)
