"""Codecs called directly with a NaN or inf (docs/failures.md#non-finite-gradients): fixed point,
top-k and adaptive raise a ValueError naming the value instead of substituting one; QSGD and
1bitSGD, whose check would cost 2 % of an encode, give back a non-finite value where it was,
never a finite substitute; none and the 16-bit casts carry it unchanged. The expected messages
are written out here from that rule. (The run loops' policy: tests/run/test_nonfinite.py.)
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from qbench.compress import build
from qbench.compress.kernels import native
from tests import compiled

NAN, INF = float("nan"), float("inf")
CODEC_RULE = (
    "the codecs take finite values only (qbench's run loop fails or skips such a step: "
    "scenario key `nonfinite`)"
)


CODECS = [
    ("fixedpoint", {"bits": 8}), ("fixedpoint", {"bits": 8, "delta": 0.01}),
    ("topk", {"ratio": 0.1}), ("topk", {"ratio": 0.1, "error_feedback": False}),
    ("adaptive", {}),
]  # fmt: skip


@pytest.fixture(params=["native", "torch"])
def backend(request: pytest.FixtureRequest) -> Any:
    """The compiled kernels and the torch reference (qsgd and onebit have both); the compiled
    ones skip without a C compiler and fail when they do not build (tests/compiled.py)."""
    if request.param == "native":
        compiled.require_c_kernels()
    with native.backend(request.param):
        yield request.param


@pytest.mark.parametrize(("name", "params"), CODECS, ids=lambda v: str(v))
@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_a_codec_refuses_a_nonfinite_value_naming_it(
    name: str, params: dict[str, Any], value: float
) -> None:
    c = build(name, **params)
    x = torch.linspace(-1.0, 1.0, 100)
    x[37] = value
    with pytest.raises(ValueError) as e:
        c.encode(x, name="g")
    assert str(e.value) == f"{name}: value 37 is {value}; {CODEC_RULE}"
    with pytest.raises(ValueError) as e:  # a piece of a per-tensor encode counts from offset
        c.encode(x[30:], offset=30, name="h")
    assert str(e.value) == f"{name}: value 37 is {value}; {CODEC_RULE}"


def test_topk_refuses_before_its_residual_changes() -> None:
    x = torch.linspace(-1.0, 1.0, 64)
    bad = x.clone()
    bad[3] = NAN
    topk = build("topk", ratio=0.1)
    topk.encode(x, name="g")
    kept = topk.state["g"].clone()
    with pytest.raises(ValueError):
        topk.encode(bad, name="g")
    assert torch.equal(topk.state["g"], kept)


@pytest.mark.parametrize(
    ("name", "params", "bucket"),
    [("qsgd", {"bits": 4, "bucket_size": 8}, slice(32, 40)),
     ("qsgd", {"bits": 4, "bucket_size": 8, "norm": "l2", "layout": "sign"}, slice(32, 40)),
     ("onebit", {"bucket_size": 16}, slice(32, 48))],
    ids=["qsgd-max", "qsgd-l2-sign", "onebit"],
)  # fmt: skip
@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_qsgd_and_onebit_carry_a_nonfinite_value_never_a_finite_substitute(
    name: str, params: dict[str, Any], bucket: slice, value: float, backend: str
) -> None:
    """Their check would cost 2 % of an encode (docs/failures.md): the API expects finite
    values and the run loop guarantees them; a NaN or inf given anyway makes the decoded value
    at its place non-finite (its bucket's scale or mean is), and the other buckets exact."""
    x = torch.linspace(-1.0, 1.0, 64)
    x[37] = value
    c = build(name, **params)
    got = c.decode(c.encode(x, name="g"))
    assert not bool(torch.isfinite(got[37]))
    outside = torch.ones(64, dtype=torch.bool)
    outside[bucket] = False
    assert bool(torch.isfinite(got[outside]).all())


def test_casts_and_none_carry_a_nonfinite_value_unchanged() -> None:
    """No substitution to refuse: the NaN or inf arrives where it was, the rest as sent."""
    x = torch.linspace(-1.0, 1.0, 10)
    x[4], x[6] = NAN, -INF
    for name in ("none", "fp16", "bf16"):
        c = build(name)
        got = c.decode(c.encode(x))
        assert math.isnan(got[4]) and got[6] == -INF, name
        assert bool(torch.isfinite(got[[0, 1, 2, 3, 5, 7, 8, 9]]).all()), name


def test_values_whose_sum_overflows_are_still_finite() -> None:
    """Two values of 3e38 sum to inf in float32; they are finite, so nothing is refused."""
    from qbench.compress.base import all_finite

    x = torch.full((1024,), 3e38)
    assert all_finite(x)
    build("topk", ratio=0.5).encode(x)
    build("fixedpoint", bits=8, delta=1e36).encode(x)
