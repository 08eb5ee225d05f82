"""The non-finite policy's pieces on one process (qbench.run.nonfinite's Guard, message and
unscale; qbench.ddp.finite's naming of a bucket's tensor), with stand-ins for the
communicator and DDP's bucket: what the mutation run of issue 44 found the multi-rank tests
leave open (the skip flag's collective, a one-rank group, the messages in full)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from qbench.ddp import finite
from qbench.run import nonfinite
from qbench.run.precision import LossScaler
from qbench.timing import PhaseTimer

NAN, INF = float("nan"), float("inf")


class Stop(Exception):
    pass


class FlagComm:
    """Records the skip flag's allreduce; ``others`` is what the other ranks found."""

    def __init__(self, world_size: int, others: bool = False, stop: bool = False) -> None:
        self.world_size, self.others, self.stop = world_size, others, stop
        self.calls: list[tuple[list[float], str, torch.device]] = []

    def allreduce_(self, flag: torch.Tensor, op: str = "sum") -> None:
        self.calls.append((flag.tolist() if not flag.is_meta else [], op, flag.device))
        if self.stop:
            raise Stop
        if op == "max":
            flag.fill_(max(float(flag.item()), float(self.others)))
        else:  # what a sum of 0/1 flags over ranks would be: not a yes/no
            flag.add_(float(self.others) * (self.world_size - 1))


def test_the_failure_line_in_full() -> None:
    assert nonfinite.message(12, "layers.3.weight", "NaN", 1) == (
        "iteration 12: gradient of layers.3.weight has NaN (rank 1); set `nonfinite: skip` to "
        "skip such steps"
    )
    assert nonfinite.message(0, "w", "inf", None) == (
        "iteration 0: gradient of w has inf; set `nonfinite: skip` to skip such steps"
    )


def test_an_unknown_policy_names_the_valid_ones() -> None:
    with pytest.raises(ValueError) as e:
        nonfinite.Guard("ignore", None, 0)
    assert str(e.value) == "nonfinite policy 'ignore' is not one of fail, skip"


def test_the_ranks_agree_on_a_skip_with_a_max_of_one_flag_on_their_device() -> None:
    timer = PhaseTimer(torch.device("cpu"))
    mine_only = FlagComm(world_size=3)
    guard = nonfinite.Guard("skip", mine_only, rank=0)
    assert guard.device == torch.device("cpu")
    assert guard.decide(4, ("w", "NaN"), timer) is False
    assert mine_only.calls == [([1.0], "max", torch.device("cpu"))]
    theirs = FlagComm(world_size=3, others=True)
    guard = nonfinite.Guard("skip", theirs, rank=2)
    assert guard.decide(5, None, timer) is False and guard.skipped == 1  # another rank's NaN
    assert theirs.calls == [([0.0], "max", torch.device("cpu"))]
    # with both ranks finding one, a sum would say 2 and `bool` hide it; max says 1 (checked)
    both = FlagComm(world_size=2, others=True)
    assert nonfinite.Guard("skip", both, 0).decide(6, ("w", "inf"), timer) is False
    clean = FlagComm(world_size=2)
    assert nonfinite.Guard("skip", clean, 0).decide(7, None, timer) is True
    assert [c[:2] for c in clean.calls] == [([0.0], "max")]


def test_the_flag_lives_on_the_device_the_guard_was_given() -> None:
    comm = FlagComm(world_size=2, stop=True)
    with pytest.raises(Stop):
        nonfinite.Guard("skip", comm, 0, device=torch.device("meta")).decide(
            1, None, PhaseTimer(torch.device("cpu"))
        )
    assert comm.calls[0][2] == torch.device("meta")


def test_a_rank_alone_decides_without_a_collective() -> None:
    """A one-rank group (or none) needs no agreement: no allreduce is paid for."""
    timer = PhaseTimer(torch.device("cpu"))
    for comm in (FlagComm(world_size=1, stop=True), None):
        guard = nonfinite.Guard("skip", comm, 0)
        assert guard.decide(1, ("w", "NaN"), timer) is False
        assert guard.decide(2, None, timer) is True
        assert guard.skipped == 1
    assert nonfinite.Guard("fail", None, 0).decide(3, None, timer) is True


def test_a_finite_gradient_is_checked_by_one_sum_not_tensor_by_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def looked(*_: Any) -> None:
        raise AssertionError("each tensor looked at, though the sum was finite")

    monkeypatch.setattr(nonfinite, "first_nonfinite", looked)
    guard = nonfinite.Guard("fail", None, 0, [("w", slice(0, 3))])
    assert guard.check(1, torch.ones(3), PhaseTimer(torch.device("cpu"))) is True


def test_a_scale_of_two_still_absorbs_an_overflow() -> None:
    """Only at scale 1 can halving not help; at 2 the scaler halves to 1 and zeroes the step."""
    scaler = LossScaler(enabled=True)
    scaler.scale = 2.0
    grad = torch.tensor([1.0, INF])
    nonfinite.unscale(scaler, grad)
    assert grad.tolist() == [0.0, 0.0] and scaler.scale == 1.0


class Bucket:
    """DDP's GradBucket as finite._first reads it."""

    def __init__(self, params: list[torch.Tensor], grads: list[torch.Tensor], buffer: torch.Tensor):
        self._p, self._g, self._b = params, grads, buffer

    def parameters(self) -> list[torch.Tensor]:
        return self._p

    def gradients(self) -> list[torch.Tensor]:
        return self._g

    def buffer(self) -> torch.Tensor:
        return self._b

    def index(self) -> int:
        return 3


def test_a_bucket_names_its_tensor_or_its_shape_or_itself() -> None:
    a, b = torch.zeros(2), torch.zeros(1, 3)
    grads = [torch.zeros(2), torch.tensor([[0.0, INF, 0.0]])]
    bucket = Bucket([a, b], grads, torch.cat([g.flatten() for g in grads]))
    assert finite._first(bucket, {id(a): "a", id(b): "layer.b"}) == ("layer.b", "inf")  # type: ignore[arg-type]
    assert finite._first(bucket, {id(a): "a"}) == ("a tensor of shape (1, 3)", "inf")  # type: ignore[arg-type]
    # every gradient view finite but the flat buffer not (a value DDP keeps outside them)
    odd = Bucket([a], [torch.zeros(2)], torch.tensor([0.0, 0.0, NAN]))
    assert finite._first(odd, {id(a): "a"}) == ("bucket 3", "NaN")  # type: ignore[arg-type]
