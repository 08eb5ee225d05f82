"""FSDP as a scheme (issue 35): the catalog's rules, qbench's collectives inside FSDP2 on two
gloo ranks (tests/dist_fsdp_prog.py, one launch), and runs through the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, cast

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from qbench import catalog
from qbench.catalog.schemes import spelling
from qbench.errors import UserError
from qbench.spec import rules
from tests import invoke
from tests.dist_fsdp_prog import QSGD2, SHARD, STEPS, known
from tests.distributed import here, launch

K = 2


# ---- catalog and rules ------------------------------------------------------------------------


def _why(scheme: str = "fsdp", comp: object = "none", **kw: object) -> str | None:
    backend = kw.pop("backend", "gloo")
    candidate = rules.Candidate(
        backend=backend, scheme=scheme, compressor=catalog.compressor(comp), **kw
    )
    return rules.why_not(candidate)


@pytest.mark.parametrize(
    ("kw", "reason"),
    [({"backend": "mpi"}, "FSDP runs on torch.distributed process groups"),
     ({"comp": "powersgd"}, "powersgd is torch's DDP communication hook"),
     ({"overrides": (catalog.compressor("none"),)}, "layer overrides cannot apply"),
     ({"telemetry": True}, "telemetry shadows a flat loop's encode"),
     ({"compute": "bf16"}, "FSDP's mixed precision is its param_dtype")],
)  # fmt: skip
def test_what_fsdp_cannot_run_is_refused_saying_why(kw: dict, reason: str) -> None:
    assert reason in (_why(**kw) or "")


@pytest.mark.parametrize("comp", ["none", "bf16", "fp16", {"name": "qsgd", "bits": 4}, "onebit"])
def test_fsdp_runs_torch_dtypes_and_qbench_codecs(comp: object) -> None:
    assert _why(comp=comp) is None
    assert spelling.overlap("fsdp", {}) == "backward"  # communicated inside backward, like DDP


def test_the_all_gather_codec_is_validated_and_named() -> None:
    spec = catalog.scheme({"name": "fsdp", "all_gather": {"name": "qsgd", "bits": 8},
                           "param_dtype": "bf16", "prefetch": 2})  # fmt: skip
    assert spec.display() == "FSDP, bf16 parameters, prefetch 2, all-gather QSGD 8-bit"
    label = catalog.scheme_label("fsdp", {"all_gather": spec.params["all_gather"],
                                          "param_dtype": "bf16", "prefetch": 2})  # fmt: skip
    assert label == "fsdp+all_gatherqsgd-8b-b512+param_dtypebf16+prefetch2"
    back = catalog.scheme_from_label(label)
    assert back.display() == spec.display() and back.params["all_gather"]["bits"] == 8
    with pytest.raises(UserError, match="keeps error-feedback state"):
        catalog.scheme({"name": "fsdp", "all_gather": "onebit"})
    with pytest.raises(UserError, match="all_gather: 'powersgd' is not a qbench codec"):
        catalog.scheme({"name": "fsdp", "all_gather": "powersgd"})


def test_qbench_fsdp_refuses_what_is_not_its_codec() -> None:
    import qbench.fsdp

    with pytest.raises(UserError, match="a 16-bit reduce-scatter is FSDP's own"):
        qbench.fsdp.register(torch.nn.Linear(2, 2), "bf16")


# ---- the collectives in one process (issue 44 item 9: bugs the two-rank cases let through) ----


class _Group:
    """FSDP's process group as the collectives read it: its size only."""

    def __init__(self, k: int) -> None:
        self.k = k

    def size(self) -> int:
        return self.k


class _Done:
    """A finished gloo work: no future (``_on_completion`` takes the end of the wait)."""

    def get_future(self) -> None:
        raise RuntimeError("gloo reduce-scatter has no future")

    def wait(self, timeout: object = None) -> bool:
        return True


def test_plain_collectives_count_the_bytes_each_rank_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    """K = 4 (at K = 2 a shard and the (K-1)/K of a block are the same bytes): a reduce-scatter
    of a 4-shard block of 10 fp32 values each sends the 3 shards the peers own, 120 B; an
    all-gather sends its 10-value shard to each of 3 peers, 120 B too; a bf16 block half."""
    from qbench.fsdp import collectives as c

    monkeypatch.setattr(c, "_SCATTER", lambda *a, **kw: _Done())
    monkeypatch.setattr(c, "_GATHER", lambda *a, **kw: _Done())
    log, group = c.CommLog(), cast(Any, _Group(4))
    log.begin(0)
    c.TimedReduceScatter(log, "b0")(torch.empty(10), torch.ones(40), group, None)
    assert log.sent == {"reduce_scatter": 3 * 10 * 4, "all_gather": 0}
    assert log.payload_bytes == 40 * 4  # the whole block gradient is this rank's to send
    work = c.TimedReduceScatter(log, "b1")(
        torch.empty(10), torch.ones(40, dtype=torch.bfloat16), group, None, async_op=True
    )
    assert work is not None
    work.wait()
    assert log.sent["reduce_scatter"] == 3 * 10 * 4 + 3 * 10 * 2
    c.TimedAllGather(log)(torch.empty(40), torch.ones(10), group)
    assert log.sent["all_gather"] == 3 * 10 * 4


def _blocks(comm: Any, step: int) -> dict[str, torch.Tensor]:
    """Blocks 0 and 1 reduce-scatter (and all-gather) the same values with QSGD 2-bit."""
    from qbench.compress import from_spec
    from qbench.fsdp import collectives as c

    grad = torch.linspace(-1, 1, 2 * SHARD) * (1 + comm.rank)
    codec, group = from_spec(QSGD2, seed=3), cast(Any, _Group(comm.world_size))
    out: dict[str, torch.Tensor] = {}
    for block in (0, 1):
        rs = c.CompressedReduceScatter(c.CommLog(), comm, codec, block)
        ag = c.CompressedAllGather(rs.log, comm, codec, block)
        rs.log.begin(step)
        out[f"rs{block}"] = torch.empty(SHARD)
        rs(out[f"rs{block}"], grad.clone(), group, dist.ReduceOp.SUM)
        out[f"ag{block}"] = torch.empty(2 * SHARD)
        ag(out[f"ag{block}"], grad[:SHARD].clone(), group)
    return out


def test_each_block_draws_from_its_own_keyed_stream() -> None:
    """Two blocks holding the same gradient must not round it with the same draws (their
    errors would add up instead of averaging out); the same block and step draws the same."""
    from tests.threadcomm import run_ranks

    first = run_ranks(2, lambda comm: _blocks(comm, step=5))
    again = run_ranks(2, lambda comm: _blocks(comm, step=5))
    for mine, same in zip(first, again, strict=True):
        for key in ("rs", "ag"):
            assert not torch.equal(mine[f"{key}0"], mine[f"{key}1"]), key
            assert torch.equal(mine[f"{key}0"], same[f"{key}0"]), key  # keyed, reproducible
            assert torch.equal(mine[f"{key}1"], same[f"{key}1"]), key


# ---- the collectives on two ranks -------------------------------------------------------------


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp")
    launch("gloo", K, [here("dist_fsdp_prog.py"), str(out)], timeout=300)
    return [torch.load(out / f"rank{r}.pt") for r in range(K)]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["rs-none/sum", "rs-none/avg", "ag-none"])
def test_the_none_codec_gives_exactly_torchs_collective(records: list[dict], case: str) -> None:
    for rank in records:
        assert torch.equal(rank[case]["qbench"], rank[case]["torch"])


@pytest.mark.slow
def test_the_compressed_reduce_scatter_sends_the_shards_it_owes(records: list[dict]) -> None:
    # none: the fp32 shard to the one peer; QSGD: one payload of the codec's size per peer
    assert records[0]["rs-none/sum"]["sent"] == (K - 1) * 4 * SHARD
    rec = records[0]["rs-unbiased"]
    assert set(rec["sent"]) == {(K - 1) * rec["wire"]} and rec["wire"] < SHARD


@pytest.mark.slow
def test_the_compressed_reduce_scatter_is_unbiased(records: list[dict]) -> None:
    grads = [known(r, K).double() for r in range(K)]
    exact = sum(grads) / K
    # QSGD 2-bit (3 intervals of [-s, s], s a bucket's max |g|): one draw's variance is at most
    # (2s/3)^2 / 4 per value and rank; the mean over K ranks and STEPS steps has sigma at most
    # s / (3 sqrt(K STEPS)). Every shard is quantized, the own one too (as reduce-broadcast's).
    s = max(float(g.abs().max()) for g in grads)
    sigma = s / (3 * (K * STEPS) ** 0.5)
    for rank, rec in enumerate(records):
        err = rec["rs-unbiased"]["mean"] - exact[rank * SHARD : (rank + 1) * SHARD]
        assert float(err.abs().max()) < 5 * sigma, (QSGD2, float(err.abs().max()), sigma)
        assert float(err.abs().mean()) < sigma
        assert float(err.abs().max()) > 0  # it did quantize


@pytest.mark.slow
def test_every_rank_gathers_the_same_decoded_parameters(records: list[dict]) -> None:
    a, b = (r["ag-qsgd"]["gathered"] for r in records)
    assert torch.equal(a, b)  # all compute with the same weights, the owner's shard too
    exact = torch.cat([known(r, 1) for r in range(K)])
    assert (a - exact).abs().max() < exact.abs().max() / 100  # 8 bits
    assert not torch.equal(a, exact)


@pytest.mark.slow
def test_error_feedback_is_kept_per_shard(records: list[dict]) -> None:
    assert records[0]["ef-slots"] == [f"rs5.{j}" for j in range(K)]


@pytest.mark.slow
def test_fsdp_through_qbench_trains_exactly_as_torchs(records: list[dict]) -> None:
    for rank in records:
        mine, theirs = rank["model/none"], rank["model/torch"]
        assert mine["losses"] == theirs["losses"]
        for name, p in theirs["params"].items():
            assert torch.equal(mine["params"][name], p), name
        coded = rank["model/qsgd8"]
        assert coded["losses"] != theirs["losses"]  # it did quantize
        assert coded["losses"][-1] < coded["losses"][0] / 4  # and it learns
        assert coded["sent"] < mine["sent"]


# ---- through the CLI --------------------------------------------------------------------------

SCENARIO = """
name: fsdp
model: {name: gpt, layers: 2, seq_len: 32}
dataset: synthetic
world_size: 2
backend: gloo
scheme:
  - ddp
  - fsdp
  - {name: fsdp, all_gather: {name: qsgd, bits: 8}}
  - {name: fsdp, param_dtype: bf16, reshard_after_forward: false, prefetch: 2}
compressor: [none, bf16, {name: qsgd, bits: 8}]
exclude:
  - {scheme: ddp, compressor: [bf16, qsgd]}
  - {scheme: {name: fsdp, param_dtype: bf16, reshard_after_forward: false, prefetch: 2},
     compressor: [none, bf16]}
optimizer: adam
warmup: 1
iterations: 3
"""


@pytest.mark.slow
def test_fsdp_runs_record_both_collectives_apart(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SCENARIO)
    out = tmp_path / "r"
    proc = invoke.run(
        [sys.executable, "-m", "qbench.cli", "sweep", str(tmp_path / "s.yaml"), "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, state = {}, {}
    for path in out.glob("*/run.json"):
        rec = json.loads(path.read_text())
        if rec["spec"]["scheme"] == "ddp":
            ddp_state = [r["state_mib"] for r in rec["memory"]["ranks"]]
            continue
        frame = pd.read_parquet(path.parent / "iterations.parquet")
        params = rec["spec"]["scheme_params"]
        how = "zero2" if "prefetch" in params else bool(params)  # True: a gathering codec
        key = (rec["spec"]["compressor"]["name"], how)
        rows[key] = frame
        state[key] = [r["state_mib"] for r in rec["memory"]["ranks"]]
    assert len(rows) == 7
    # each rank holds 1/K of the parameters, gradients and Adam's moments (shards padded)
    for held in state.values():
        assert all(0.49 < s / ddp_state[0] < 0.52 for s in held), (held, ddp_state)
    fp32 = rows[("none", False)]
    grad = int(fp32["grad_bytes"].iloc[0])
    # reshard after forward: each shard (grad / K) gathered twice; fp32 reduce-scatter (K-1)/K
    assert (fp32["bytes_allgather"] == 2 * (K - 1) * grad / K).all()
    assert (fp32["bytes_reduce_scatter"] == (K - 1) * grad / K).all()
    assert (fp32["bytes_sent"] == fp32["bytes_allgather"] + fp32["bytes_reduce_scatter"]).all()
    assert (rows[("bf16", False)]["bytes_reduce_scatter"] == (K - 1) * grad / K / 2).all()
    assert (rows[("qsgd", False)]["bytes_reduce_scatter"] < grad / K / 3).all()
    assert (rows[("qsgd", True)]["bytes_allgather"] < fp32["bytes_allgather"] / 3).all()
    # bf16 parameters, kept after forward (ZeRO-2), prefetched 2 ahead: gathered once, in bf16
    assert (rows[("qsgd", "zero2")]["bytes_allgather"] == (K - 1) * grad / K / 2).all()
    for frame in rows.values():
        phases = frame["t_compute"] + frame["t_comm"] + frame["t_step"]
        assert ((phases - frame["t_iteration"]).abs() < 1e-3).all()
        assert (frame[["t_allgather_total", "t_reduce_scatter_total"]] > 0).all().all()
