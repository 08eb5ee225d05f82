"""The compressors' arithmetic against references written here, not taken from the code under
test: the counter-based draws (lowbias32 in numpy's wrapping uint32 arithmetic, as C computes
it), fixed-point's exponent and its power-of-two scaling (float64, rounded once), and the few
values a compressor must pass through bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qbench.compress import build, fixedpoint, qsgd
from qbench.compress.base import Key
from qbench.compress.kernels import draws, rng


def _lowbias32(x: np.ndarray) -> np.ndarray:
    """Chris Wellons' lowbias32, in uint32 arithmetic that wraps as C's does."""
    x = np.asarray(x, dtype=np.uint32).copy()
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


WORDS = [0, 1, 2, 12345, 0xDEADBEEF, 0x80000000, 0xFFFFFFFF]


def test_lowbias32_matches_the_c_arithmetic() -> None:
    assert [rng.lowbias32(w) for w in WORDS] == [int(v) for v in _lowbias32(np.array(WORDS))]
    # pinned, so that a change to both sides still shows
    assert [rng.lowbias32(w) for w in (1, 2, 0xDEADBEEF)] == [1753845952, 3507691905, 3861431939]


def test_key_hash_folds_stream_rank_step_seed_in_that_order() -> None:
    for seed, step, rank, stream in [(0, 0, 0, 0), (7, 3, 1, 2), (2**40 + 5, 99, 3, 1)]:
        h = _lowbias32(np.array([stream]))
        for field in (rank, step, seed):
            h = _lowbias32(h ^ np.uint32(field & 0xFFFFFFFF))
        key = Key(seed=seed, step=step, rank=rank, stream=stream)
        assert rng.key_hash(key) == int(h[0])


def test_uniform_draws_are_the_top_24_bits_of_the_mixed_index() -> None:
    key = Key(seed=3, step=5, rank=1, stream=0)
    offset, n = 2**32 - 3, 7  # the index wraps at 2^32, as in C's uint32 maths
    idx = (np.arange(offset, offset + n, dtype=np.uint64) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    mixed = _lowbias32(idx * np.uint32(0x9E3779B1) + np.uint32(rng.key_hash(key)))
    want = (mixed >> np.uint32(8)).astype(np.float64) / 2**24
    got = rng.uniform_reference(key, offset, n)
    assert got.dtype == torch.float32 and got.tolist() == want.tolist()
    assert draws.uniform(key, offset, n).tolist() == want.tolist()  # on the CPU by default


@pytest.mark.parametrize(
    ("top", "high", "e"),
    [
        (1.0, 127, -6),  # 127 * 2^-6 = 1.98 >= 1 > 127 * 2^-7 = 0.99
        (127.0, 127, 0),  # exactly high: no scaling
        (math.nextafter(1016.0, math.inf), 127, 4),  # just above 127 * 2^3
        (1e-3, 7, -12),  # 7 * 2^-12 = 0.0017 >= 0.001 > 7 * 2^-13 = 0.00085
        (math.nextafter(2.0**-20, math.inf), 1, -19),  # log2 rounds to -20: the loop corrects it
        (0.0, 127, 0),  # all zero
        (math.inf, 127, 0),  # not finite: left unscaled
        (math.nan, 127, 0),
    ],
)
def test_auto_exponent_is_the_smallest_that_fits(top: float, high: int, e: int) -> None:
    assert fixedpoint._auto_exponent(top, high) == e


def test_times_pow2_rounds_once_like_float64_then_float32() -> None:
    x = (1 + torch.arange(0, 4096, dtype=torch.float64) * 2.0**-23).to(torch.float32)
    x = torch.cat([x, -x, torch.tensor([0.0, 3.0, 2.0**100])])
    for e in range(-160, 140, 3):
        want = (x.double() * 2.0**e).float()  # exact in float64 here, then one rounding
        assert torch.equal(fixedpoint._times_pow2(x, e), want), e
    tiny = fixedpoint._times_pow2(torch.tensor([1 + 2.0**-23]), -150)
    assert tiny.item() == 2.0**-149  # just over half the smallest subnormal: rounds up, not to 0


def test_auto_fixed_point_of_an_empty_gradient_has_exponent_0() -> None:
    c = build("fixedpoint", bits=8, delta="auto")
    payload = c.encode(torch.zeros(0))
    assert payload.buffers["exponent"].tolist() == [0]
    assert c.decode(payload).numel() == 0


def test_qsgd_16_bit_levels_of_the_wrong_size_are_refused_by_name() -> None:
    with pytest.raises(ValueError) as err:
        qsgd._unpack_codes(torch.zeros(5, dtype=torch.uint8), 16, 3)
    assert str(err.value) == "qsgd: expected 6 bytes of 16-bit levels, got 5"


def test_topk_without_error_feedback_sends_the_gradient_bit_for_bit() -> None:
    """-0.0 stays -0.0: the values are the gradient's own, not a sum with a zero residual."""
    c = build("topk", ratio=1.0, error_feedback=False)
    grad = torch.tensor([-0.0, 2.0, -1.0])
    payload = c.encode(grad)
    sent = payload.buffers["values"][payload.buffers["indices"].argsort()]
    assert torch.signbit(sent).tolist() == [True, False, True]
    assert not c.state  # and nothing kept for a next step
