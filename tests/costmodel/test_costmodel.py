"""Cost model: fits recover known parameters, scaling formulas, ideal speedups, the model file,
validation and the ``qbench cost`` commands. Pure: synthetic timings, no processes."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from qbench import catalog
from qbench import costmodel as cm
from qbench.catalog import CompressorSpec
from qbench.cli.cost import cost as cost_cli
from qbench.cli.cost.configs import scheme_option
from qbench.costmodel import Config, CostModel
from qbench.errors import UserError
from qbench.records.schema import RunRecord, iterations_frame
from qbench.records.store import ResultStore
from qbench.spec.network import Link, option
from tests import costmodel_reference as ref
from tests.paths import ROOT


def spec(label: str) -> CompressorSpec:
    """The catalog's compressor behind a label (the model takes specs, tables name labels)."""
    return catalog.from_label(label)


UNSHAPED, R500M = Link(), option("500mbit")

QSGD = "qsgd-4b-b512"
QSGD_BITS = 4 + 32 / 512
ALPHA = {"allreduce": 60e-6, "exchange": 90e-6, "allreduce-int": 40e-6}
BETA_1GBIT = {"allreduce": 8.5e-9, "exchange": 17e-9, "allreduce-int": 9e-9}
"""Seconds per byte at 1 gbit; scaled by 1gbit / rate on other links."""
CODEC = {"encode": (20e-6, 0.7e-9), "decode": (10e-6, 0.5e-9)}
"""(c0, c1 per unit) of every synthetic codec phase."""
SCHEMES = (("allreduce", "fp32"), ("reduce-broadcast", QSGD), ("integer-allreduce", QSGD))
SIZES = tuple(4**i * 4096 for i in range(8))  # 4 KiB .. 64 MiB


def synthetic_rows(
    network: str, world_sizes: tuple[int, ...] = (2,), *, credit: float = 0.0,
    noise: float = 0.0, seed: int = 0, backend: str = "gloo",
) -> list[dict[str, Any]]:  # fmt: skip
    """Bench comm rows whose times follow the hand-written formulas of
    tests/costmodel_reference.py exactly (times a uniform noise factor), not the model's own:
    a wrong message count, byte count or codec work in qbench.costmodel shows in the fit."""
    rng = np.random.default_rng(seed)
    rate = ref.RATE_BPS[network]
    rows = []
    for k in world_sizes:
        for s in SIZES:
            for scheme, comp in SCHEMES:
                n = s / 4
                item = ref.comm(scheme, comp, k, n, backend)
                beta = BETA_1GBIT[item.key] * 1e9 / rate
                comm = ref.comm_seconds(ALPHA[item.key], beta, item, credit)
                phase = {}
                for op, (c0, c1) in CODEC.items():
                    coded = comp != "fp32" or op == "decode"
                    phase[op] = c0 + c1 * ref.codec_units(scheme, k, n, op) if coded else 0.0
                # as bench comm reports them: integer-allreduce's payload is its integers
                pbits = ref.payload_bits(scheme, comp, backend, k)
                f = 1 + noise * rng.uniform(-1, 1, 3)
                enc, comm, dec = phase["encode"] * f[0], comm * f[1], phase["decode"] * f[2]
                rows.append({
                    "backend": backend, "world_size": k, "network": network, "scheme": scheme,
                    "compressor": comp, "bytes": s, "time_s": enc + comm + dec,
                    "t_encode_s": enc, "t_comm_s": comm, "t_decode_s": dec,
                    "wire_bytes": item.wire, "payload_bytes": n * pbits / 8,
                    "bits_per_value": pbits,
                })  # fmt: skip
    return rows


def comm_doc(rows: list[dict[str, Any]], cores: int = 64) -> dict[str, Any]:
    return {"schema": cm.COMM_SCHEMA, "machine": {"cores": cores}, "rows": rows}


def kernels_doc() -> dict[str, Any]:
    rows = []
    for comp, bits in (("fp32", 32.0), ("fp16", 16.0), (QSGD, QSGD_BITS)):
        for numel in (2**16, 2**20, 2**22):
            for op, (c0, c1) in CODEC.items():
                rows.append({
                    "compressor": comp, "op": op, "numel": numel, "device": "cpu",
                    "seconds": c0 + c1 * numel, "copy_seconds": 1e-6 + 0.25e-9 * numel,
                    "bits_per_value": bits,
                })  # fmt: skip
    return {"schema": cm.KERNELS_SCHEMA, "rows": rows}


def fit_of(m: CostModel, collective: str, network: str) -> cm.CollectiveFit:
    return next(c for c in m.collectives if (c.collective, c.network) == (collective, network))


# -- fitting -------------------------------------------------------------------------------------
def test_fit_recovers_known_alpha_beta_from_noisy_timings() -> None:
    rows = synthetic_rows("unshaped", (2, 4, 8), noise=0.03, seed=1)
    m = cm.fit(comm_docs=[(comm_doc(rows), "synthetic")])
    for key in ALPHA:
        c = fit_of(m, key, "unshaped")
        assert c.alpha_s == pytest.approx(ALPHA[key], rel=0.05), key
        assert c.beta_s_per_byte == pytest.approx(BETA_1GBIT[key], rel=0.03), key
        assert c.credit_s == 0.0  # unshaped links have no tbf bucket
        assert c.points == 3 * len(SIZES)
        assert c.r2 > 0.99
    enc = next(p for p in m.phases if (p.scheme, p.op) == ("reduce-broadcast", "encode"))
    assert enc.c1_s == pytest.approx(CODEC["encode"][1], rel=0.03)
    # integer-allreduce rows report their int8 payload; the compressor's own bits are kept
    assert m.compressors == {"fp32": 32.0, QSGD: QSGD_BITS}


def test_bench_rows_the_catalog_cannot_read_are_left_out_with_a_note() -> None:
    rows = synthetic_rows("1gbit")
    odd = [{**rows[0], "compressor": "zstd-9"}, {**rows[0], "scheme": "gossip"}]
    m, clean = (cm.fit(comm_docs=[(comm_doc(r), "s")]) for r in (rows + odd, rows))
    assert (m.collectives, m.phases) == (clean.collectives, clean.phases)
    assert "s: no compressor zstd-9; its rows are not used" in m.notes
    assert "s: no model for scheme gossip; its rows are not used" in m.notes


def test_fit_at_one_world_size_gives_alpha_per_step() -> None:
    """At K = 2 a ring allreduce is 2 steps: the intercept is 2 alpha."""
    rows = synthetic_rows("unshaped", (2,))
    c = fit_of(cm.fit(comm_docs=[(comm_doc(rows), "s")]), "allreduce", "unshaped")
    assert c.alpha_s == pytest.approx(ALPHA["allreduce"], rel=1e-6)
    assert c.beta_s_per_byte == pytest.approx(BETA_1GBIT["allreduce"], rel=1e-6)


def test_fit_recovers_tbf_credit_on_an_emulated_link() -> None:
    rows = synthetic_rows("1gbit", (2, 4), credit=1.5e-3, noise=0.01, seed=2)
    m = cm.fit(comm_docs=[(comm_doc(rows), "s")])
    for key in ALPHA:
        c = fit_of(m, key, "1gbit")
        assert c.beta_s_per_byte == pytest.approx(BETA_1GBIT[key], rel=0.03), key
        assert c.credit_s == pytest.approx(1.5e-3, rel=0.05), key
        assert c.alpha_s == pytest.approx(ALPHA[key], rel=0.1, abs=5e-6), key


def test_nnls_keeps_coefficients_nonnegative() -> None:
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    coef = cm.nnls(x, np.array([3.0, 2.0, 1.0]))  # unconstrained slope would be -1
    assert (coef >= 0).all()
    assert coef[1] == 0.0 and coef[0] == pytest.approx(2.0)


# -- formulas ------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 4, 8])
def test_world_size_formulas(k: int) -> None:
    s = 1 << 20
    assert cm.collective_msgs("allreduce", k) == 2 * (k - 1)
    assert cm.collective_wire("allreduce", k, s) == pytest.approx(2 * (k - 1) / k * s)
    assert cm.allreduce_wire(s, k) == (2 * (k - 1) * s) // k  # qbench.comm.base bus bytes
    assert cm.collective_msgs("alltoallv", k) == cm.collective_msgs("allgatherv", k) == k - 1
    assert cm.collective_wire("alltoallv", k, s) == pytest.approx((k - 1) / k * s)
    assert cm.collective_wire("allgatherv", k, s) == pytest.approx((k - 1) * s)
    t = cm.collective_time(1e-4, 1e-9, "allreduce", k, s)
    assert t == pytest.approx(2 * (k - 1) * 1e-4 + 2 * (k - 1) / k * s * 1e-9)
    rb = cm.comm_plan(cm.Scheme("reduce-broadcast"), spec(QSGD), k, s / 4, QSGD_BITS, "gloo")
    payload = s / 4 * QSGD_BITS / 8
    assert rb.calls == pytest.approx(((k - 1) / k * payload,) * 2)  # alltoallv, allgatherv
    assert rb.msgs == 2 * (k - 1)


def test_integer_allreduce_width_follows_the_backend() -> None:
    assert cm.int_sum_bytes("gloo", 2, 7) == 1  # 2 x 7 fits int8
    assert cm.int_sum_bytes("gloo", 20, 7) == 4  # 140 overflows int8; gloo cannot sum int16
    assert cm.int_sum_bytes("mpi", 20, 7) == 2
    with pytest.raises(UserError):
        cm.int_sum_bytes("gloo", 2**20, 32767)


def test_bandwidth_scaling_keeps_alpha_and_scales_beta() -> None:
    c = cm.CollectiveFit(backend="gloo", network="1gbit", collective="allreduce", alpha_s=1e-4,
                         beta_s_per_byte=8e-9, credit_s=1e-3, r2=1.0, points=2,
                         rel_err_median=0.0, rel_err_max=0.0)  # fmt: skip
    w = 4e6
    assert cm.scale_beta(8e-9, 1e9, 500e6) == pytest.approx(16e-9)
    assert c.time(2, (w,), option("500mbit"), tbf=False) == pytest.approx(2e-4 + w * 16e-9)
    assert c.time(2, (w,), option("10gbit"), tbf=False) == pytest.approx(2e-4 + w * 0.8e-9)
    assert c.time(2, (w,)) == pytest.approx(2e-4 + w * 8e-9 - 1e-3)  # the credit, once a call
    assert c.time(2, (1e3,)) == pytest.approx(2e-4)  # within the burst: latency only
    assert cm.burst_s(option("1gbit")) == pytest.approx(2e-3)
    assert cm.burst_s(option("unshaped")) == 0.0
    with pytest.raises(UserError, match="cannot scale"):
        c.time(2, (w,), option("unshaped"))


def test_predicts_other_world_sizes_and_links_from_k2_at_1gbit() -> None:
    m = cm.fit(comm_docs=[(comm_doc(synthetic_rows("1gbit", (2,))), "s")])
    for k, net in ((8, "1gbit"), (4, "500mbit"), (16, "10gbit")):
        cfg = Config(scheme=cm.Scheme("allreduce"), network=option(net), world_size=k, numel=2**24)
        p = cm.predict(m, cfg)
        beta = BETA_1GBIT["allreduce"] * 1e9 / ref.RATE_BPS[net]
        wire = 2 * (k - 1) / k * 2**26
        want = 2 * (k - 1) * ALPHA["allreduce"] + wire * beta
        assert p.comm_s == pytest.approx(want, rel=1e-6), (k, net)
        assert p.wire_bytes == pytest.approx(wire)


# -- predictions ---------------------------------------------------------------------------------
def free_model(beta: float = 1e-9) -> CostModel:
    """Bytes only: no latency, no credit, no codec, no compute."""
    fits = [
        cm.CollectiveFit(backend="gloo", network="unshaped", collective=key, alpha_s=0.0,
                         beta_s_per_byte=beta, r2=1.0, points=2, rel_err_median=0.0,
                         rel_err_max=0.0)
        for key in ("allreduce", "allreduce-fp16", "allreduce-int", "exchange", "allgather")
    ]  # fmt: skip
    kernels = [
        cm.CodecFit(backend="", scheme="", compressor=comp, op=op, device="cpu", c0_s=0.0,
                    c1_s=0.0, r2=1.0, points=2, rel_err_median=0.0, rel_err_max=0.0)
        for comp in ("fp32", "fp16", QSGD, "") for op in ("encode", "decode", "copy")
    ]  # fmt: skip
    return CostModel(collectives=fits, kernels=kernels)


@pytest.mark.parametrize(
    ("scheme", "comp", "k", "ideal"),
    [
        ("reduce-broadcast", QSGD, 2, 32 / QSGD_BITS),
        ("reduce-broadcast", QSGD, 8, 32 / QSGD_BITS),  # same bytes per rank as ring allreduce
        ("integer-allreduce", QSGD, 4, 32 / (8 + 32 / 512)),  # sums int8
        (cm.PROJECTED, QSGD, 4, 32 / QSGD_BITS),  # native low-precision allreduce
        ("allreduce", "fp16", 4, 2.0),
        ("allgather", QSGD, 4, 2 * 3 / 4 * 32 / (3 * QSGD_BITS)),  # K-1 payloads per rank
    ],
)
def test_ideal_speedups_when_compute_and_codec_are_free(
    scheme: str, comp: str, k: int, ideal: float
) -> None:
    cfg = Config(scheme=scheme_option(scheme), compressor=spec(comp), network=UNSHAPED,
                 world_size=k, numel=2**24)  # fmt: skip
    frame = cm.predict_frame(free_model(), [cfg])
    assert frame["speedup_vs_fp32"].iloc[0] == pytest.approx(ideal, rel=1e-3)
    assert frame["mode"].iloc[0] == ("projected" if scheme == cm.PROJECTED else "breakdown")


def test_scalability_and_grown_model() -> None:
    m = free_model(beta=1 / 2**26)  # a 64 MiB fp32 allreduce at K = 2 takes 1 s
    fit = cm.ComputeFit(workload="toy", batch_size=32, device="cpu", compute_s=1.0, step_s=0.1,
                        numel=2**24, runs=1, world_sizes=[1, 2])  # fmt: skip
    m.compute.append(fit)
    frame = cm.predict_frame(m, [Config(network=UNSHAPED, world_size=2, workload="toy")])
    row = frame.iloc[0]
    assert row["numel"] == 2**24 and row["total_s"] == pytest.approx(2.1)
    assert row["scalability"] == pytest.approx(2 * 1.1 / 2.1)  # K t(1) / t(K)
    assert row["samples_per_s"] == pytest.approx(64 / 2.1)
    grown = cm.predict(m, Config(network=UNSHAPED, workload="toy", numel=2**25))
    assert grown.compute_s == 1.0  # compute fixed, gradient doubled
    assert grown.step_s == pytest.approx(0.2) and grown.comm_s == pytest.approx(2.0)


def test_overlap_is_max_of_codec_and_comm_plus_fill() -> None:
    m = free_model(beta=1e-9)
    m.collectives = [replace_alpha(c, 1e-4) for c in m.collectives]
    m.phases = [
        cm.CodecFit(backend="gloo", scheme="reduce-broadcast", compressor=QSGD, op=op,
                    device="cpu", c0_s=0.0, c1_s=c1, r2=1.0, points=2, rel_err_median=0.0,
                    rel_err_max=0.0)
        for op, c1 in (("encode", 1e-9), ("decode", 2e-9))
    ]  # fmt: skip
    n, k = 2**24, 2
    base = Config(
        scheme=cm.Scheme("reduce-broadcast"), compressor=spec(QSGD), network=UNSHAPED, numel=n
    )
    sync = cm.predict(m, base)
    piped = cm.predict(m, Config(**{**base.__dict__, "scheme": cm.Scheme("reduce-broadcast", 8)}))
    codec = sync.encode_s + sync.decode_s
    assert codec == pytest.approx(n * 1.5e-9 + 2 * n * 2e-9)
    assert piped.comm_s == pytest.approx(sync.comm_s + 7 * 2 * (k - 1) * 1e-4)  # 8x messages
    assert piped.total_s == pytest.approx(max(codec, piped.comm_s) + codec / 8)
    assert piped.mode == "overlap" and sync.total_s == pytest.approx(codec + sync.comm_s)


def replace_alpha(c: cm.CollectiveFit, alpha: float) -> cm.CollectiveFit:
    return cm.CollectiveFit(**{**c.__dict__, "alpha_s": alpha})


def test_incompatible_and_unknown_schemes_are_user_errors() -> None:
    m = free_model()
    with pytest.raises(UserError, match="lowprec-allreduce"):
        cm.predict(
            m,
            Config(scheme=cm.Scheme("allreduce"), compressor=spec(QSGD), network=UNSHAPED, numel=8),
        )
    with pytest.raises(UserError, match="valid"):
        scheme_option("gossip")
    assert scheme_option("reduce-broadcast:overlap=4") == cm.Scheme("reduce-broadcast", 4)
    assert scheme_option("integer-allreduce:overlap=8").label == "integer-allreduce+overlap8"
    with pytest.raises(UserError, match="overlap"):
        scheme_option("allgather:overlap=2")
    with pytest.raises(UserError, match="no fit"):
        cm.predict(m, Config(scheme=cm.Scheme("allreduce"), network=option("1gbit"), numel=8))


# -- model file and validation -------------------------------------------------------------------
def add_run(
    store: ResultStore, run_id: str, comp: str, scheme: str, k: int, *, compute: float = 0.05,
    lag: float = 1.0, repeat: int = 0,
) -> None:  # fmt: skip
    """A finished run; ``lag``: iteration time (the slowest rank's) over the sum of phases."""
    numel, step = 1_000_000, 0.004
    payload = numel * (QSGD_BITS / 8 if comp != "fp32" else 4)
    labels = {
        "model": "toy", "dataset": "synthetic", "backend": "gloo", "device": "cpu",
        "scheme": scheme, "compressor": comp, "compressor_name": "qsgd" if comp != "fp32" else
        "none", "bits": 4.0 if comp != "fp32" else 32.0, "world_size": k, "batch_size": 16,
        "global_batch": 16 * k, "simulated": False, "network": "unshaped", "numel": numel,
        "seed": 0, "repeat": repeat,
    }  # fmt: skip
    store.write_record(RunRecord(run_id=run_id, status="ok", labels=labels, spec={}))
    rows = []
    for rank in range(k):
        for it in range(6):
            t = {"t_compute": compute, "t_encode": 0.001, "t_comm": 0.01 * (k - 1),
                 "t_decode": 0.001, "t_step": step}  # fmt: skip
            rows.append({
                "run_id": run_id, "rank": rank, "iteration": it, "warmup": it < 2, **t,
                "t_iteration": lag * sum(t.values()), "bytes_sent": int(payload * (k - 1)),
                "payload_bytes": int(payload), "grad_bytes": 4 * numel, "loss": 1.0,
            })  # fmt: skip
    store.write_iterations(run_id, iterations_frame(rows))


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    store = ResultStore(root)
    add_run(store, "toy-fp32-w1", "fp32", "allreduce", 1)
    add_run(store, "toy-fp32-w2", "fp32", "allreduce", 2)
    add_run(store, "toy-rb-w2", QSGD, "reduce-broadcast", 2)
    return root


def test_compute_fit_from_runs(runs_dir: Path) -> None:
    m = cm.fit(run_dirs=[runs_dir], kernel_docs=[(kernels_doc(), "k")])
    (c,) = m.compute
    assert (c.workload, c.batch_size, c.device, c.numel) == ("toy", 16, "cpu", 1_000_000)
    assert c.compute_s == pytest.approx(0.05) and c.step_s == pytest.approx(0.004)
    assert c.runs == 3 and c.world_sizes == [1, 2]
    assert "run:toy-rb-w2" in m.used


def test_model_json_round_trips(tmp_path: Path, runs_dir: Path) -> None:
    rows = synthetic_rows("1gbit", (2,), credit=1e-3)
    m = cm.fit(comm_docs=[(comm_doc(rows), "c")], kernel_docs=[(kernels_doc(), "k")],
               run_dirs=[runs_dir])  # fmt: skip
    path = tmp_path / "model.json"
    m.save(path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == cm.SCHEMA and doc["collectives"][0]["data"]  # the points are kept
    back = CostModel.load(path)
    assert back.to_dict() == m.to_dict()
    cfg = Config(scheme=cm.Scheme("reduce-broadcast"), compressor=spec(QSGD), network=R500M,
                 world_size=4, workload="toy")  # fmt: skip
    assert cm.predict(back, cfg) == cm.predict(m, cfg)
    path.write_text(json.dumps({"schema": "something/1"}))
    with pytest.raises(UserError, match="not a fitted cost model"):
        CostModel.load(path)


def test_validation_on_held_out_link_and_world_size() -> None:
    fitted = comm_doc(synthetic_rows("1gbit", (2,), credit=1.2e-3))
    m = cm.fit(comm_docs=[(fitted, "fit.json")], kernel_docs=[(kernels_doc(), "k")])
    held = comm_doc(synthetic_rows("500mbit", (2, 4), credit=1.2e-3))
    table = cm.validate_comm(m, held, "held.json")
    assert len(table) == 2 * len(SIZES) * len(SCHEMES)
    assert not table["in_fit"].any()
    assert table["error"].abs().max() < 1e-3
    s = cm.summarize_validation(table)
    assert s.passed and s.points == len(table)
    again = cm.validate_comm(m, fitted, "fit.json")
    assert again["in_fit"].all() and cm.summarize_validation(again).points == 0


def test_validation_of_runs(runs_dir: Path) -> None:
    rows = synthetic_rows("unshaped", (2,))
    m = cm.fit(comm_docs=[(comm_doc(rows), "c")], run_dirs=[runs_dir])
    table = cm.validate(m, [runs_dir])
    assert set(table["kind"]) == {"run"} and len(table) == 3
    assert table["in_fit"].all()
    w1 = table[table["world_size"] == 1].iloc[0]
    assert w1["predicted_s"] == pytest.approx(w1["measured_s"], rel=0.05)  # compute + step


def test_hold_out_leaves_runs_out_of_the_fit(runs_dir: Path) -> None:
    rows = synthetic_rows("unshaped", (2,))
    m = cm.fit(comm_docs=[(comm_doc(rows), "c")], run_dirs=[runs_dir],
               hold_out=[("world_size", "2")])  # fmt: skip
    assert "run:toy-fp32-w1" in m.used and "run:toy-fp32-w2" not in m.used
    table = cm.validate(m, [runs_dir]).set_index("world_size")
    assert bool(table.loc[1, "in_fit"]) and not table.loc[2, "in_fit"].any()
    assert cm.summarize_validation(table.reset_index()).points == 2
    with pytest.raises(UserError, match="no run label 'ranks'"):
        cm.fit(run_dirs=[runs_dir], hold_out=[("ranks", "2")])
    with pytest.raises(UserError, match="after --hold-out"):
        cm.fit(run_dirs=[runs_dir], hold_out=[("backend", "gloo")])


def test_runs_on_fewer_cores_than_ranks_are_normalized(tmp_path: Path) -> None:
    """4 CPU ranks on a 2-core host compute twice as slowly: the fit divides that out, and the
    prediction for that run puts it back (the run's machine.cores)."""
    store = ResultStore(tmp_path)
    for k in (1, 4):
        add_run(store, f"toy-fp32-w{k}", "fp32", "allreduce", k)
        record = store.read_record(f"toy-fp32-w{k}")
        assert record is not None
        store.write_record(replace(record, machine={"cores": 2}))
    path = store.iterations_path("toy-fp32-w4")  # ws 4: CPU parts twice as long
    frame = pd.read_parquet(path)
    frame[["t_compute", "t_step"]] *= 2
    frame["t_iteration"] = frame[["t_compute", "t_encode", "t_comm", "t_decode", "t_step"]].sum(
        axis=1
    )
    store.write_iterations("toy-fp32-w4", frame)
    m = cm.fit(run_dirs=[tmp_path], comm_docs=[(comm_doc(synthetic_rows("unshaped", (2,))), "c")])
    (c,) = m.compute
    assert c.compute_s == pytest.approx(0.05) and c.step_s == pytest.approx(0.004)
    cfg = Config(scheme=cm.Scheme("allreduce"), network=UNSHAPED, world_size=4, workload="toy",
                 batch_size=16, host_cores=2)  # fmt: skip
    p = cm.predict(m, cfg)
    assert (p.compute_s, p.step_s) == (pytest.approx(0.1), pytest.approx(0.008))
    table = cm.validate_runs(m, tmp_path).set_index("world_size")
    cpu = table["predicted_s"] - table["predicted_comm_s"]  # from each run's machine.cores
    assert cpu[4] == pytest.approx(2 * cpu[1], rel=1e-6)


def test_compute_is_taken_at_the_fitted_world_size(tmp_path: Path) -> None:
    """Two ranks on one host compute slower than one (memory bandwidth, comm threads): a
    prediction at a world size the runs had uses that world size's compute; others the pooled
    per-rank time."""
    store = ResultStore(tmp_path)
    add_run(store, "toy-fp32-w1", "fp32", "allreduce", 1, compute=0.040)
    add_run(store, "toy-fp32-w2", "fp32", "allreduce", 2, compute=0.060)
    add_run(store, "toy-fp32-w2b", "fp32", "allreduce", 2, compute=0.062)
    m = cm.fit(run_dirs=[tmp_path], comm_docs=[(comm_doc(synthetic_rows("unshaped", (2,))), "c")])
    (c,) = m.compute
    assert c.per_world_size["1"][0] == pytest.approx(0.040)
    assert c.per_world_size["2"][0] == pytest.approx(0.061)
    assert c.compute_s == pytest.approx(0.060)  # pooled median over the three runs
    cfg = Config(scheme=cm.Scheme("allreduce"), network=UNSHAPED, workload="toy", batch_size=16)
    assert cm.predict(m, replace(cfg, world_size=1)).compute_s == pytest.approx(0.040)
    assert cm.predict(m, replace(cfg, world_size=2)).compute_s == pytest.approx(0.061)
    assert cm.predict(m, replace(cfg, world_size=8)).compute_s == pytest.approx(0.060)
    # another host (cores differ): the per-rank time, scaled by its sharing
    other = replace(cfg, world_size=2, host_cores=1)
    assert cm.predict(m, other).compute_s == pytest.approx(2 * 0.060)


def test_imbalance_is_fitted_per_scheme_and_world_size(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    add_run(store, "toy-fp32-w1", "fp32", "allreduce", 1)
    add_run(store, "toy-fp32-w2", "fp32", "allreduce", 2, lag=1.02)
    add_run(store, "toy-rb-w2", QSGD, "reduce-broadcast", 2, lag=1.15)
    m = cm.fit(run_dirs=[tmp_path], comm_docs=[(comm_doc(synthetic_rows("unshaped", (2,))), "c")],
               kernel_docs=[(kernels_doc(), "k")])  # fmt: skip
    assert m.imbalance == {
        "gloo/allreduce/2": pytest.approx(1.02), "gloo/reduce-broadcast/2": pytest.approx(1.15)
    }  # fmt: skip
    cfg = Config(scheme=cm.Scheme("reduce-broadcast"), compressor=spec(QSGD), network=UNSHAPED,
                 world_size=2, workload="toy", batch_size=16)  # fmt: skip
    p = cm.predict(m, cfg)
    parts = p.compute_s + p.encode_s + p.comm_s + p.decode_s + p.step_s
    assert p.wait_s == pytest.approx(0.15 * parts)
    assert p.total_s == pytest.approx(1.15 * parts)
    p4 = cm.predict(m, replace(cfg, world_size=4))  # borrowed from K = 2, with a note
    assert p4.wait_s > 0 and any("taken from 2" in n for n in p4.notes)
    p1 = cm.predict(m, replace(cfg, world_size=1))
    assert p1.wait_s == 0
    assert CostModel.from_dict(json.loads(json.dumps(m.to_dict()))).imbalance == m.imbalance


def test_one_rank_comm_overhead_is_fitted_from_runs(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    add_run(store, "toy-rb-w1", QSGD, "reduce-broadcast", 1)
    frame = pd.read_parquet(store.iterations_path("toy-rb-w1"))
    frame["t_comm"] = 0.0005  # gloo's collectives on one rank still cost
    store.write_iterations("toy-rb-w1", frame)
    add_run(store, "toy-rb-w2", QSGD, "reduce-broadcast", 2)
    m = cm.fit(run_dirs=[tmp_path], comm_docs=[(comm_doc(synthetic_rows("unshaped", (2,))), "c")],
               kernel_docs=[(kernels_doc(), "k")])  # fmt: skip
    assert m.solo_comm == {"gloo/reduce-broadcast/toy": pytest.approx(0.0005)}
    cfg = Config(scheme=cm.Scheme("reduce-broadcast"), compressor=spec(QSGD), network=UNSHAPED,
                 world_size=1, workload="toy", batch_size=16)  # fmt: skip
    assert cm.predict(m, cfg).comm_s == pytest.approx(0.0005)
    assert cm.predict(m, replace(cfg, backend="mpi")).comm_s == 0.0  # no 1-rank mpi runs


def test_validation_takes_the_median_over_repeats(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    for r, compute in enumerate((0.04, 0.05, 0.09)):  # one noisy repeat
        add_run(store, f"toy-fp32-w1-r{r}", "fp32", "allreduce", 1, compute=compute, repeat=r)
    m = cm.fit(run_dirs=[tmp_path], comm_docs=[(comm_doc(synthetic_rows("unshaped", (2,))), "c")],
               hold_out=[("repeat", "2")])  # fmt: skip
    table = cm.validate_runs(m, tmp_path)
    assert len(table) == 1
    row = table.iloc[0]
    assert row["runs"] == 3 and bool(row["in_fit"])
    assert row["measured_s"] == pytest.approx(0.05 + 0.001 + 0.001 + 0.004, rel=1e-6)


def test_host_cores_scale_codec_and_compute() -> None:
    m = free_model()
    m.phases = [
        cm.CodecFit(backend="gloo", scheme="reduce-broadcast", compressor=QSGD, op="encode",
                    device="cpu", c0_s=0.0, c1_s=1e-9, r2=1.0, points=2, rel_err_median=0.0,
                    rel_err_max=0.0)
    ]  # fmt: skip
    cfg = Config(scheme=cm.Scheme("reduce-broadcast"), compressor=spec(QSGD), network=UNSHAPED,
                 world_size=4, numel=2**20, compute_s=1.0)  # fmt: skip
    one = cm.predict(m, cfg)
    shared = cm.predict(m, Config(**{**cfg.__dict__, "host_cores": 2}))
    assert shared.compute_s == 2.0 and shared.encode_s == pytest.approx(2 * one.encode_s)
    assert shared.comm_s == one.comm_s
    # replayed compute sleeps (compute: replay): only the codecs share the cores
    slept = cm.predict(m, Config(**{**cfg.__dict__, "host_cores": 2, "replayed_compute": True}))
    assert slept.compute_s == 1.0 and slept.encode_s == shared.encode_s


# -- CLI -----------------------------------------------------------------------------------------
@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "comm": tmp_path / "comm_1gbit.json", "held": tmp_path / "comm_500mbit.json",
        "kernels": tmp_path / "kernels.json", "model": tmp_path / "model.json",
    }  # fmt: skip
    paths["comm"].write_text(json.dumps(comm_doc(synthetic_rows("1gbit", (2,), credit=1e-3))))
    paths["held"].write_text(json.dumps(comm_doc(synthetic_rows("500mbit", (2,), credit=1e-3))))
    paths["kernels"].write_text(json.dumps(kernels_doc()))
    return paths


def invoke(*argv: str | Path) -> Any:
    return CliRunner().invoke(cost_cli, [str(a) for a in argv])


def test_cli_fit_predict_validate(files: dict[str, Path]) -> None:
    res = invoke("fit", "--comm", files["comm"], "--kernels", files["kernels"], "--out",
                 files["model"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "exchange" in res.stdout and files["model"].is_file()
    res = invoke(
        "predict", files["model"], "--world-size", "2", "4", "8", "--bandwidth", "1gbit",
        "10gbit", "--model-numel", "61M", "--compressor", "qsgd:bits=4,bucket_size=512",
        "--scheme", "reduce-broadcast", "lowprec-allreduce", "--compute-s", "0.1",
        "--format", "json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 3 * 2 * 3  # K x links x (fp32 baseline, two schemes)
    assert {r["numel"] for r in rows} == {61_000_000}
    base = [r for r in rows if r["compressor"] == "fp32"]
    assert all(r["speedup_vs_fp32"] == pytest.approx(1.0) for r in base)
    projected = [r for r in rows if r["scheme"] == cm.PROJECTED]
    assert projected and all(r["mode"] == "projected" for r in projected)
    res = invoke("predict", files["model"], "--world-size", "2", "4")
    assert res.exit_code == 0, res.output
    assert "predicted iteration time" in res.stdout
    res = invoke("validate", files["model"], files["held"], files["comm"])
    assert res.exit_code == 0, res.output
    assert "held out: 24 rows" in res.stderr and "24/24 within 15%" in res.stderr
    res = invoke("validate", files["model"], files["held"], "--format", "csv")
    assert res.stdout.splitlines()[0].startswith("source,kind,backend")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fit", "--out", "{tmp}/m.json"], "nothing to fit"),
        (["fit", "--comm", "{tmp}/missing.json", "--out", "{tmp}/m.json"], "not found"),
        (["fit", "--comm", "{kernels}", "--out", "{tmp}/m.json"], "use --kernels"),
        (["fit", "{comm}", "--out", "{tmp}/m.json"], "not a results directory"),
        (["predict", "{model}", "--bandwidth", "fast"], "--bandwidth must be a rate"),
        (["predict", "{model}", "--scheme", "gossip"], "no scheme 'gossip'"),
        (["predict", "{model}", "--compressor", "nosuch"], "unknown compressor"),
        (["predict", "{model}", "--model-numel", "lots"], "--model-numel"),
        (["predict", "{model}", "--world-size", "0"], "--world-size"),
        (["predict", "{model}", "--backend", "mpi"], "not in the model"),
        (["predict", "{model}", "--bandwidth", "unshaped"], "no fit"),
        (["predict", "{comm}"], "not a fitted cost model"),
        (["predict", "{model}", "--model", "alexnet"], "no compute fit"),
        (["validate", "{model}", "{kernels}"], "kernel timings"),
    ],
)
def test_cli_user_errors_are_one_line(
    files: dict[str, Path], tmp_path: Path, argv: list[str], message: str
) -> None:
    res = invoke("fit", "--comm", files["comm"], "--kernels", files["kernels"], "--out",
                 files["model"])  # fmt: skip
    assert res.exit_code == 0, res.output
    names = {k: str(v) for k, v in files.items()}
    res = invoke(*(a.format(tmp=tmp_path, **names) for a in argv))
    assert isinstance(res.exception, UserError), (res.exception, res.output)
    text = str(res.exception)
    assert message in text and "\n" not in text


def test_cli_predict_reads_model_numel_counts(files: dict[str, Path]) -> None:
    invoke("fit", "--comm", files["comm"], "--out", files["model"])
    res = invoke("predict", files["model"], "--scheme", "integer-allreduce", "--model-numel",
                 "2.5e6", "500k", "--format", "csv", "--no-tbf-burst")  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert len(lines) == 1 + 2 * 2  # header; two sizes x (baseline, integer-allreduce)
    assert any(",2500000," in line for line in lines) and any(",500000," in line for line in lines)
    assert not math.isnan(float(lines[1].split(",")[lines[0].split(",").index("total_s")]))


def test_repeatability_script_compares_one_rank_runs(tmp_path: Path) -> None:
    """benchmarks/repeatability.py (README's noise floor): 1-rank configurations of two sweeps,
    matched whatever their link label, as the ratio of median iteration times."""
    import importlib.util

    for name, compute in (("a", 0.05), ("b", 0.06)):
        store = ResultStore(tmp_path / name)
        add_run(store, "toy-fp32-w1", "fp32", "allreduce", 1, compute=compute)
        add_run(store, "toy-fp32-w2", "fp32", "allreduce", 2, compute=compute)
    path = ROOT / "benchmarks" / "repeatability.py"
    spec = importlib.util.spec_from_file_location("repeatability", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    frame = module.compare(str(tmp_path / "a"), str(tmp_path / "b"))
    assert len(frame) == 1  # the 2-rank runs are left out
    parts = 0.001 + 0.001 + 0.004  # encode, decode, step; no comm at one rank
    assert frame["change"].iloc[0] == pytest.approx((0.06 + parts) / (0.05 + parts) - 1)
