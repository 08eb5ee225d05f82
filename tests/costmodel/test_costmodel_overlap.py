"""The overlap-aware cost model of DDP runs against hand-written expectations.

The bucket timeline on hand-made profiles (literal numbers), DDP predictions on a hand-built
model against ``tests/costmodel_reference.py`` (its ``ddp_iteration`` and the schemes' byte
counts, no qbench import), the crossover against DDP fp32 on a model whose answer is solved by
hand, the bucket profile fitted from synthetic ``buckets.parquet`` files, and validation of a
synthetic results directory with DDP runs. Pure: no processes.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from qbench.cli.cost import cost as cost_cli
from qbench.cli.cost.configs import scheme_option
from qbench.costmodel import (
    BucketProfile,
    CodecFit,
    CollectiveFit,
    Config,
    CostModel,
    crossover,
    exposed,
    fit,
    predict,
    timeline,
    validate_runs,
)
from qbench.errors import UserError
from qbench.records.schema import RunRecord, buckets_frame, iterations_frame
from qbench.records.store import ResultStore
from qbench.spec.network import option
from tests import costmodel_reference as ref
from tests.costmodel.test_costmodel import ALPHA, BETA_1GBIT, CODEC, comm_doc, spec, synthetic_rows

Q4 = "qsgd-4b-b512"
Q4_BITS = 4 + 32 / 512
QSPEC = "qsgd:bits=4,bucket_size=512"


# -- the timeline --------------------------------------------------------------------------------
def test_a_bucket_waits_for_the_previous_one() -> None:
    # handed at 1, 2, 3 and 2 s each: 1-3, then 3-5 (waits 1 s), then 5-7; 7 - 3 = 4 s exposed
    spans = timeline([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])
    assert spans == [(1.0, 3.0), (3.0, 5.0), (5.0, 7.0)]
    assert exposed([1.0, 2.0, 3.0], spans) == pytest.approx(4.0)


def test_all_but_the_last_bucket_hidden() -> None:
    # each done before the next is handed over: only the last one's own 0.5 s shows
    handed = [1.0, 4.0, 9.0]
    spans = timeline(handed, [2.0, 3.0, 0.5])
    assert spans == [(1.0, 3.0), (4.0, 7.0), (9.0, 9.5)]
    assert exposed(handed, spans) == pytest.approx(0.5)
    assert exposed(handed, timeline(handed, [2.0, 3.0, 0.0])) == 0.0  # all hidden


def test_all_exposed_when_handed_over_at_the_end() -> None:
    handed = [3.0, 3.0, 3.0]  # one hand-over instant: nothing runs beside backward
    assert exposed(handed, timeline(handed, [1.0, 2.0, 3.0])) == pytest.approx(6.0)


# -- predictions on a hand-built model -----------------------------------------------------------
A = {"allreduce": 60e-6, "allreduce-fp16": 55e-6, "exchange": 90e-6}
B = {"allreduce": 8e-9, "allreduce-fp16": 8.5e-9, "exchange": 16e-9}
"""alpha (s per message step) and beta (s per byte at 1 gbit) of each collective."""
C = {
    ("allreduce", "fp32", "encode"): (0.0, 0.0), ("allreduce", "fp32", "decode"): (5e-6, 0.25e-9),
    ("allreduce", "fp16", "encode"): (10e-6, 0.5e-9),
    ("allreduce", "fp16", "decode"): (10e-6, 0.6e-9),
    ("reduce-broadcast", Q4, "encode"): (20e-6, 0.7e-9),
    ("reduce-broadcast", Q4, "decode"): (10e-6, 0.5e-9),
    ("reduce-broadcast", "fp32", "encode"): (0.0, 0.0),
    ("reduce-broadcast", "fp32", "decode"): (5e-6, 0.3e-9),
}  # fmt: skip
"""(c0, c1 per codec unit) of each (scheme, compressor, op)."""
NUMEL = [3_000_000, 1_000_000, 50_000]
HANDED = [0.012, 0.030, 0.041]
FWD, BWD, STEP = 0.015, 0.041, 0.006
PSGD = [200_000.0, 80_000.0, 200_000.0]


def collective(key: str, alpha: float, beta: float) -> CollectiveFit:
    return CollectiveFit(
        backend="gloo", network="1gbit", collective=key, alpha_s=alpha, beta_s_per_byte=beta,
        r2=1.0, points=1, rel_err_median=0.0, rel_err_max=0.0,
    )  # fmt: skip


def codec(scheme: str, comp: str, op: str, c0: float, c1: float) -> CodecFit:
    return CodecFit(
        backend="gloo", scheme=scheme, compressor=comp, op=op, device="cpu", c0_s=c0, c1_s=c1,
        r2=1.0, points=1, rel_err_median=0.0, rel_err_max=0.0,
    )  # fmt: skip


def profile(**change: Any) -> BucketProfile:
    base: dict[str, Any] = {
        "workload": "toy", "batch_size": 16, "device": "cpu", "world_size": 2,
        "bucket_cap_mb": 25.0, "numel": NUMEL, "handed_s": HANDED, "forward_s": FWD,
        "backward_s": BWD, "step_s": STEP, "runs": 1, "measured": "ddp fp32 unshaped",
        "payload_bytes": {"powersgd-r1": PSGD},
    }  # fmt: skip
    return BucketProfile(**{**base, **change})


def hand_model(*profiles: BucketProfile) -> CostModel:
    return CostModel(
        collectives=[collective(k, A[k], B[k]) for k in A],
        phases=[codec(s, c, op, *v) for (s, c, op), v in C.items()],
        buckets=list(profiles) or [profile()],
    )


def cfg(scheme: str, comp: str, **kw: Any) -> Config:
    bits = {"fp32": 32.0, "fp16": 16.0, Q4: Q4_BITS}.get(comp)
    base: dict[str, Any] = {"network": option("1gbit"), "world_size": 2, "workload": "toy",
                            "tbf_burst": False}  # fmt: skip
    return Config(scheme=scheme_option(scheme), compressor=spec(comp), bits_per_value=bits,
                  **{**base, **kw})  # fmt: skip


def seconds(scheme: str, comp: str, k: int, n: float, rate: float = 1e9) -> float:
    """One bucket of n values through the flat scheme: encode + collective + decode."""
    c = ref.comm(scheme, comp, k, n)
    t = ref.comm_seconds(A[c.key], B[c.key] * 1e9 / rate, c)
    for op in ("encode", "decode"):
        c0, c1 = C[(scheme, comp, op)]
        t += c0 + c1 * ref.codec_units(scheme, k, n, op)
    return t


@pytest.mark.parametrize(("rate", "label"), [(1e9, "1gbit"), (10e9, "10gbit")])
def test_ddp_fp32_is_one_allreduce_per_bucket(rate: float, label: str) -> None:
    p = predict(hand_model(), cfg("ddp", "fp32", network=option(label)))
    want, waited = ref.ddp_iteration(
        FWD, BWD, STEP, HANDED, [seconds("allreduce", "fp32", 2, n, rate) for n in NUMEL]
    )
    assert p.total_s == pytest.approx(want, rel=1e-9)
    assert p.comm_s == pytest.approx(waited, rel=1e-9)
    assert p.compute_s == pytest.approx(FWD + BWD) and p.step_s == pytest.approx(STEP)
    assert p.mode == "backward" and math.isnan(p.encode_s) and math.isnan(p.decode_s)
    assert p.wire_bytes == pytest.approx(sum(4 * n for n in NUMEL))  # 2 (K-1)/K = 1 at K = 2
    if rate == 1e9:  # bucket 0 takes ~97 ms: the others wait for it, ~100 ms left exposed
        assert waited > 0.09
    else:  # ~11 ms and ~3.5 ms, done before the next hand-over: only the last bucket shows
        assert waited == pytest.approx(seconds("allreduce", "fp32", 2, NUMEL[2], rate), rel=1e-9)


def test_ddp_fp16_and_powersgd() -> None:
    m = hand_model()
    p = predict(m, cfg("ddp", "fp16"))
    want, _ = ref.ddp_iteration(FWD, BWD, STEP, HANDED,
                                [seconds("allreduce", "fp16", 2, n) for n in NUMEL])  # fmt: skip
    assert p.total_s == pytest.approx(want, rel=1e-9)
    # PowerSGD: allreduces of P and Q, half of the measured payload each, no codec time
    k = 4
    psgd = [2 * ref.ring_steps(k) * A["allreduce"] + 2 * ref.ring_bytes(b / 2, k) * B["allreduce"]
            for b in PSGD]  # fmt: skip
    p = predict(m, cfg("ddp", "powersgd-r1", world_size=k))
    want, _ = ref.ddp_iteration(FWD, BWD, STEP, HANDED, psgd)
    assert p.total_s == pytest.approx(want, rel=1e-9)
    assert any("taken from 2" in n for n in p.notes)  # the profile was measured at 2 ranks
    with pytest.raises(UserError, match="no DDP run"):
        predict(m, cfg("ddp", "powersgd-r2"))


def test_qbench_hook_runs_the_flat_exchange_per_bucket() -> None:
    m = hand_model()
    k = 4
    p = predict(m, cfg("reduce-broadcast:backward=true", Q4, world_size=k))
    want, waited = ref.ddp_iteration(
        FWD, BWD, STEP, HANDED, [seconds("reduce-broadcast", Q4, k, n) for n in NUMEL]
    )
    assert p.total_s == pytest.approx(want, rel=1e-9)
    assert p.comm_s == pytest.approx(waited, rel=1e-9)
    # the same through `overlap: backward` on the flat spelling
    same = predict(m, cfg("reduce-broadcast", Q4, world_size=k, overlap="backward"))
    assert same.total_s == pytest.approx(want, rel=1e-9)
    # layer policy: 10 % of the values in fp32, the same share of every bucket, exchanged apart
    f32 = sum(NUMEL) // 10
    p = predict(m, cfg("reduce-broadcast:backward=true", Q4, world_size=k, fp32_numel=f32))
    mixed = [seconds("reduce-broadcast", Q4, k, 0.9 * n) + seconds("reduce-broadcast", "fp32",
             k, 0.1 * n) for n in NUMEL]  # fmt: skip
    assert p.total_s == pytest.approx(ref.ddp_iteration(FWD, BWD, STEP, HANDED, mixed)[0], rel=1e-9)


def test_imbalance_and_shared_cores_scale_the_profile() -> None:
    # measured with 4 ranks on 2 cores (2x slow), predicted with 8 on 2 (4x): profile times x 2,
    # codec (fitted on a core per rank) x 4
    m = hand_model(profile(imbalance=1.2, host_cores=2, world_size=4))
    k = 8
    p = predict(m, cfg("reduce-broadcast:backward=true", Q4, world_size=k, host_cores=2))
    busy = []
    for n in NUMEL:
        c = ref.comm("reduce-broadcast", Q4, k, n)
        coll = ref.comm_seconds(A["exchange"], B["exchange"], c)
        busy.append(coll + 4 * (seconds("reduce-broadcast", Q4, k, n) - coll))
    want, waited = ref.ddp_iteration(2 * FWD, 2 * BWD, 2 * STEP, [2 * h for h in HANDED], busy,
                                     imbalance=1.2)  # fmt: skip
    assert p.total_s == pytest.approx(want, rel=1e-9)
    assert p.wait_s == pytest.approx(0.2 * (2 * (FWD + BWD + STEP) + waited), rel=1e-9)


def test_ddp_prediction_errors_are_one_line() -> None:
    m = hand_model()
    for bad, message in [
        (cfg("ddp", "fp32", workload="resnet20"), "no DDP bucket profile"),
        (cfg("ddp:bucket_cap_mb=10.0", "fp32"), "bucket cap 10 MB"),
        (cfg("ddp", "fp32", compute_s=0.1), "does not apply to DDP"),
        (cfg("ddp", "fp32", numel=10), "DDP predictions use the measured model's buckets"),
        (cfg("ddp", Q4), "torch's hooks"),
        (cfg("ddp", "fp32", overlap="none"), "communicates during backward"),
        (cfg("allreduce", "powersgd-r1"), "torch's DDP communication hook"),
    ]:
        with pytest.raises(UserError, match=message) as got:
            predict(m, bad)
        assert "\n" not in str(got.value)


# -- crossover -----------------------------------------------------------------------------------
def one_bucket_model(qsgd: float = 1.0) -> CostModel:
    """One bucket handed over at the end of backward: all of its communication is exposed.
    ``qsgd`` scales the qsgd codec's times."""
    m = hand_model(profile(numel=[1_000_000], handed_s=[0.05], backward_s=0.05, payload_bytes={}))
    m.collectives = [collective(k, 60e-6, 8e-9) for k in ("allreduce", "exchange")]
    m.phases = [codec(s, c, op, *(qsgd * x if c == Q4 else x for x in v))
                for (s, c, op), v in C.items()]  # fmt: skip
    return m


def test_crossover_rate_solved_by_hand() -> None:
    # K = 2, n = 1e6, g = 1 Gbit/s / rate. DDP fp32: 2 alpha + 4 n beta g + decode(n);
    # reduce-broadcast qsgd: encode(1.5 n) + 2 alpha + P beta g + decode(2 n), P = n Q4_BITS / 8.
    # Equal at g* = (encode + decode - decode_fp32) / ((4 n - P) beta).
    n, beta = 1e6, 8e-9
    enc = 20e-6 + 0.7e-9 * 1.5 * n
    dec = 10e-6 + 0.5e-9 * 2 * n
    dec32 = 5e-6 + 0.25e-9 * n
    g = (enc + dec - dec32) / ((4 * n - n * Q4_BITS / 8) * beta)
    x = crossover(one_bucket_model(), cfg("reduce-broadcast:backward=true", Q4))
    assert x.verdict == "crossover" and len(x.rates_bps) == 1
    assert x.rates_bps[0] == pytest.approx(1e9 / g, rel=1e-5)  # 15.3 Gbit/s
    assert x.faster_below == (True,)  # compression wins on the slower links
    for rate, mine, ddp in x.points:
        assert (mine < ddp) == (rate < x.rates_bps[0])


def test_crossover_always_and_never() -> None:
    # a free codec: qsgd is faster at every rate; 2000 times the codec (4.2 s): slower even at
    # 10 Mbit/s, where DDP fp32 pays (4 n - P) beta g = 2.8 s more on the wire
    always = crossover(one_bucket_model(0.0), cfg("reduce-broadcast:backward=true", Q4))
    assert always.verdict == "always" and always.rates_bps == ()
    never = crossover(one_bucket_model(2000.0), cfg("reduce-broadcast:backward=true", Q4))
    assert never.verdict == "never in range" and never.rates_bps == ()


# -- fitting the profile from buckets.parquet ----------------------------------------------------
def add_ddp_run(
    store: ResultStore, run_id: str, *, scheme: str = "ddp", comp: str = "fp32",
    network: str = "unshaped", k: int = 2, seed: int = 0, forward: float = 0.010,
    backward: float = 0.012, step: float = 0.003, waited: float = 0.002,
    iteration: float | None = None, payload: list[float] | None = None,
) -> None:  # fmt: skip
    """A finished DDP run: 2 warm-up iterations with DDP's first bucket layout (4 buckets), then
    4 measured ones with 3 buckets handed over at base + (0, 1, 2, 9 ms) + rank / 2 ms: over
    iterations and ranks the median is base + 1.75 ms (the mean would be base + 3.25 ms)."""
    numel, base = [5000, 3000, 1000], [0.004, 0.009, 0.012]
    payload = payload or [4.0 * n for n in numel]
    labels = {
        "model": "toy", "dataset": "synthetic", "backend": "gloo", "device": "cpu",
        "scheme": scheme, "compressor": comp, "world_size": k, "batch_size": 16,
        "network": network, "numel": sum(numel), "seed": seed, "repeat": 0,
        "overlap": "backward",
    }  # fmt: skip
    store.write_record(RunRecord(run_id=run_id, status="ok", labels=labels, spec={}))
    parts = forward + backward + waited + step
    its, bks = [], []
    for rank in range(k):
        for it in range(6):
            its.append({
                "run_id": run_id, "rank": rank, "iteration": it, "warmup": it < 2,
                "t_forward": forward, "t_compute": forward + backward, "t_encode": math.nan,
                "t_comm": waited, "t_decode": math.nan, "t_step": step,
                "t_iteration": iteration or parts, "bytes_sent": 1, "grad_bytes": 4 * sum(numel),
                "payload_bytes": int(sum(payload)), "loss": 1.0,
            })  # fmt: skip
            layout = [100, 200, 300, 400] if it < 2 else numel
            for b, n in enumerate(layout):
                late = (0, 1, 2, 9)[it - 2] if it >= 2 else 0
                handed = 0.001 * b if it < 2 else base[b] + 0.001 * late + 0.0005 * rank
                bks.append({
                    "run_id": run_id, "rank": rank, "iteration": it, "warmup": it < 2,
                    "bucket": b, "numel": n, "payload_bytes": int(payload[b]) if it >= 2 else 0,
                    "t_handed": handed, "t_ready": handed + 0.001,
                })  # fmt: skip
    store.write_iterations(run_id, iterations_frame(its))
    frame = buckets_frame(bks)
    frame.to_parquet(store.buckets_path(run_id))


def test_bucket_profile_from_buckets_parquet(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    add_ddp_run(store, "ddp-fp32", iteration=1.1 * (0.010 + 0.012 + 0.002 + 0.003))
    # less preferred for the times (qbench's hook on a shaped link): not used for them
    add_ddp_run(store, "rb-q4", scheme="reduce-broadcast+backward", comp=Q4, network="1gbit",
                forward=0.5, backward=0.5)  # fmt: skip
    add_ddp_run(store, "psgd-w4", comp="powersgd-r1", k=4, payload=[400.0, 300.0, 100.0])
    m = fit(run_dirs=[tmp_path])
    (two,) = [b for b in m.buckets if b.world_size == 2]
    assert two.numel == [5000, 3000, 1000]  # the rebuilt buckets, not the warm-up layout
    assert two.handed_s == pytest.approx([0.00575, 0.01075, 0.01375])
    assert (two.forward_s, two.backward_s, two.step_s) == pytest.approx((0.010, 0.012, 0.003))
    assert two.imbalance == pytest.approx(1.1)
    assert two.measured == "ddp fp32 unshaped" and two.runs == 1
    assert two.bucket_cap_mb == 25.0 and two.batch_size == 16 and two.workload == "toy"
    assert two.payload_bytes == {"powersgd-r1": [400.0, 300.0, 100.0]}  # from the 4-rank run
    (four,) = [b for b in m.buckets if b.world_size == 4]
    assert four.measured == "ddp powersgd-r1 unshaped"
    path = tmp_path / "model.json"
    m.save(path)
    assert CostModel.load(path).buckets == m.buckets


def test_bucket_profile_prefers_torch_ddp_over_a_qbench_hook_at_fp32(tmp_path: Path) -> None:
    # both fp32 and unshaped: torch's own allreduce hook (ddp) is the least disturbed
    store = ResultStore(tmp_path)
    add_ddp_run(store, "rb-fp32", scheme="reduce-broadcast+backward", forward=0.5, backward=0.5)
    add_ddp_run(store, "ddp-fp32", forward=0.010, backward=0.012)
    (prof,) = fit(run_dirs=[tmp_path]).buckets
    assert prof.measured == "ddp fp32 unshaped" and prof.runs == 1
    assert (prof.forward_s, prof.backward_s) == pytest.approx((0.010, 0.012), rel=1e-9)


def test_powersgd_local_work_is_its_runs_excess_over_its_collectives(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    add_ddp_run(store, "ddp-fp32")
    payload, handed, local = [400.0, 300.0, 100.0], [0.00575, 0.01075, 0.01375], 0.050

    def by_hand(rate: float) -> float:  # P and Q allreduces, half the payload each (k = 2)
        beta = BETA_1GBIT["allreduce"] * 1e9 / rate
        busy = [2 * ref.ring_steps(2) * ALPHA["allreduce"] + 2 * ref.ring_bytes(b / 2, 2) * beta
                for b in payload]  # fmt: skip
        return ref.ddp_iteration(0.010, 0.012, 0.003, handed, busy)[0]

    for seed, extra in ((0, local - 0.004), (1, local), (2, local + 0.020)):  # median: local
        add_ddp_run(store, f"psgd-1g-s{seed}", comp="powersgd-r1", network="1gbit", seed=seed,
                    payload=payload, iteration=by_hand(1e9) + extra)  # fmt: skip
    doc = comm_doc(synthetic_rows("1gbit", (2,)))
    m = fit(comm_docs=[(doc, "c")], run_dirs=[tmp_path])
    (prof,) = m.buckets
    assert prof.local_s == {"powersgd-r1": pytest.approx(local, rel=1e-6)}
    p = predict(m, cfg("ddp", "powersgd-r1", network=option("300mbit")))
    assert p.total_s == pytest.approx(by_hand(300e6) + local, rel=1e-6)
    assert any("local work 50 ms per iteration, fitted" in n for n in p.notes)
    bare = hand_model()  # no PowerSGD run fitted: said, not guessed
    assert any("not modelled" in n for n in predict(bare, cfg("ddp", "powersgd-r1")).notes)


# -- validation ----------------------------------------------------------------------------------
def test_validation_of_held_out_ddp_runs(tmp_path: Path) -> None:
    root = tmp_path / "results"
    store = ResultStore(root)
    add_ddp_run(store, "ddp-fp32")
    payload = [n * Q4_BITS / 8 for n in (5000, 3000, 1000)]
    for seed, t in ((0, 0.030), (1, 0.034)):
        add_ddp_run(store, f"rb-q4-300m-s{seed}", scheme="reduce-broadcast+backward", comp=Q4,
                    network="300mbit", seed=seed, iteration=t, payload=payload)  # fmt: skip
    doc = comm_doc(synthetic_rows("1gbit", (2,)))
    m = fit(comm_docs=[(doc, "c")], run_dirs=[root], hold_out=[("network", "300mbit")])
    table = validate_runs(m, root).set_index("network")
    row = table.loc["300mbit"]
    assert row["runs"] == 2 and not row["in_fit"] and table.loc["unshaped", "in_fit"]
    assert row["measured_s"] == pytest.approx(0.032)  # median of the two seeds
    # by hand: the profile of the fp32 ddp run; each bucket the exchange at 300 Mbit/s
    busy = []
    for n in (5000, 3000, 1000):
        c = ref.comm("reduce-broadcast", Q4, 2, n)
        t = ref.comm_seconds(ALPHA["exchange"], BETA_1GBIT["exchange"] * 1e9 / 300e6, c)
        for op, (c0, c1) in CODEC.items():
            t += c0 + c1 * ref.codec_units("reduce-broadcast", 2, n, op)
        busy.append(t)
    handed = [0.00575, 0.01075, 0.01375]
    want, waited = ref.ddp_iteration(0.010, 0.012, 0.003, handed, busy)
    assert row["predicted_s"] == pytest.approx(want, rel=1e-4)
    assert row["predicted_comm_s"] == pytest.approx(waited, rel=1e-4)
    assert row["error"] == pytest.approx(want / 0.032 - 1, rel=1e-3)


def test_cli_predicts_ddp_and_finds_the_crossover(tmp_path: Path) -> None:
    root = tmp_path / "results"
    add_ddp_run(ResultStore(root), "ddp-fp32")
    comm = tmp_path / "comm.json"
    comm.write_text(json.dumps(comm_doc(synthetic_rows("1gbit", (2,)))))
    model = tmp_path / "model.json"

    def run(*argv: Any) -> Any:
        res = CliRunner().invoke(cost_cli, [str(a) for a in argv])
        assert res.exit_code == 0, (res.output, res.exception)
        return res

    run("fit", root, "--comm", comm, "--out", model)
    res = run("predict", model, "--model", "toy", "--scheme", "ddp",
              "reduce-broadcast:backward=true", "--compressor", "none", QSPEC,
              "--bandwidth", "1gbit", "--format", "json")  # fmt: skip
    rows = pd.DataFrame(json.loads(res.stdout))
    ddp = rows[(rows["scheme"] == "ddp") & (rows["compressor"] == "fp32")]
    assert len(ddp) == 1 and ddp["speedup_vs_ddp"].iloc[0] == pytest.approx(1.0)
    assert set(rows["mode"]) == {"breakdown", "backward"}  # the flat fp32 baseline and DDP rows
    assert "reduce-broadcast+backward" in set(rows["scheme"])  # ddp + qsgd: qbench's hook
    res = run("predict", model, "--model", "toy", "--scheme", "ddp", "--bandwidth", "1gbit")
    assert "vs ddp" in res.stdout and "comm all" in res.stdout
    res = run("crossover", model, "--model", "toy", "--scheme", "reduce-broadcast:backward=true",
              "--compressor", QSPEC)  # fmt: skip
    assert "than DDP fp32" in res.stdout
    res = run("crossover", model, "--model", "toy", "--scheme", "reduce-broadcast:backward=true",
              "--compressor", QSPEC, "--format", "csv")  # fmt: skip
    frame = pd.read_csv(io.StringIO(res.stdout))
    assert {"verdict", "crossover_bps", "rate_bps", "ddp_total_s"} <= set(frame.columns)
