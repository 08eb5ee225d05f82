"""The integer view of FP8 / MX / NVFP4 (qbench.compress.integer_sum.FloatUnits) on its compiled
ends, the C loops (kernels/cpu/qbench_cpu.c) and the CUDA kernels (kernels/lowfloat.cu, run on
CPU threads by the emulator), against its torch reference, byte for byte: the integers of every
code and every element format, both roundings, every integer width, short and odd sizes, draws
at element offsets past 2^32; and stochastic draws keyed by the global element index, so that a
range (a chunk of the pipelined integer allreduce) encodes as the whole does.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from functools import partial

import pytest
import torch

from qbench import aggregate
from qbench.compress import from_spec, integer_sum
from qbench.compress.base import Key
from qbench.compress.kernels import cuda, native
from qbench.compress.kernels.cuda import emulate as cuda_emulate
from qbench.timing import PhaseTimer
from tests import compiled
from tests.compress.kernels.cuda.test_cuda import needs_gpu
from tests.compress.kernels.test_lowfloat_kernels import _adversarial, _random
from tests.threadcomm import ThreadComm, run_ranks

FORMATS = ["fp8:block_size=128", "mx:element=e4m3", "mx:element=e3m2", "mx:element=e2m3", "mx",
           "nvfp4:scope=global"]  # fmt: skip
ROUNDINGS = ["nearest", "stochastic"]
DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64]
KEY = Key(seed=5, step=3, rank=2)
PATHS = ("torch", "c", "cuda")  # cuda: the CUDA kernels, emulated


@pytest.fixture(autouse=True, scope="module")
def _kernels() -> None:
    compiled.require_c_kernels()  # skip without compilers, fail when a build is broken
    compiled.require_emulator()


@pytest.fixture(autouse=True)
def _restore_modes() -> Iterator[None]:
    backend, mode = native._backend, cuda_emulate._mode
    yield
    native._backend, cuda_emulate._mode = backend, mode


def _view(spec: str, rounding: str) -> integer_sum.FloatUnits:
    view = integer_sum.for_compressor(
        from_spec(f"{spec}{',' if ':' in spec else ':'}rounding={rounding}")
    )
    assert isinstance(view, integer_sum.FloatUnits)
    return view


@contextlib.contextmanager
def _path(name: str, on: torch.Tensor) -> Iterator[None]:
    """Run a block on one path, checking that the view's dispatch takes it."""
    mode = "emulate" if name == "cuda" else "off"
    with native.backend("torch" if name == "torch" else "native"), cuda_emulate.emulation(mode):
        want = {"torch": None, "c": native.CPU, "cuda": cuda.CUDA}[name]
        assert native.kernels_for(on) is want
        yield


def _each_path(fn: Callable[[], torch.Tensor], on: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    for name in PATHS:
        with _path(name, on):
            out[name] = fn()
    return out


def _decode(
    view: integer_sum.FloatUnits, sums: torch.Tensor, scales: torch.Tensor, k: int
) -> torch.Tensor:
    """The decode into a fresh buffer of NaNs: an element a path leaves unwritten shows."""
    return view.decode(sums, scales, k, torch.full((sums.numel(),), float("nan")))


def _assert_same(got: dict[str, torch.Tensor], where: object) -> None:
    want = got["torch"]
    for name, g in got.items():
        assert (g.dtype, g.shape) == (want.dtype, want.shape), (where, name)
        same = g.contiguous().view(torch.uint8) == want.contiguous().view(torch.uint8)
        if not bool(same.all()):
            first = int((~same).nonzero()[0, 0]) // want.element_size()
            pytest.fail(f"{where}: {name} element {first} is {g[first].item()!r}, the torch "
                        f"reference {want[first].item()!r}")  # fmt: skip


def _ranks(view: integer_sum.FloatUnits, n: int, seed: int) -> list[torch.Tensor]:
    """Three ranks' gradients: values aimed at every branch of the element rounding on rank 0
    (ties, their neighbours, saturation, subnormals, -0.0, blocks of zeros), random elsewhere."""
    return [_adversarial(view.comp, n, seed)] + [_random(n, seed + r) * r for r in (1, 2)]


def _shared(view: integer_sum.FloatUnits, xs: list[torch.Tensor]) -> torch.Tensor:
    """The blocks' shared divisors (every path's), from the ranks' MAX of their block maxima
    (the C loop's and torch's)."""
    maxima = []
    for x in xs:
        got = _each_path(partial(view.local_scales, x), x)
        _assert_same(got, "local scales")
        maxima.append(got["torch"])
    amax = torch.stack(maxima).amax(0)
    got = _each_path(partial(view.share, amax), amax)
    _assert_same(got, "divisors")
    return got["torch"]


def _sizes(view: integer_sum.FloatUnits) -> list[int]:
    return [0, 1, view.block - 1, view.block + 1, 4097]


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("spec", FORMATS)
def test_both_ends_match_the_reference_byte_for_byte(spec: str, rounding: str) -> None:
    view = _view(spec, rounding)
    for i, n in enumerate(_sizes(view)):
        dtype = DTYPES[i % len(DTYPES)]  # every width, over the sizes
        for seed, offset in ((n, 0), (n + 1, 2**32 - 7)):  # the second crosses 2^32
            xs = _ranks(view, n, seed)
            shared = _shared(view, xs)
            ints = []
            for r, x in enumerate(xs):
                got = _each_path(partial(view.encode, x, shared, KEY, offset, dtype), x)
                _assert_same(got, (n, offset, "encode rank", r))
                ints.append(got["torch"].to(torch.int64))
            # the cast keeps the low bits where K x top overflows dtype: any integers decode
            sums = torch.stack(ints).sum(0).to(dtype)
            got = _each_path(partial(_decode, view, sums, shared, 3), sums)
            _assert_same(got, (n, offset, "decode"))


@pytest.mark.parametrize("spec", FORMATS)
def test_every_code_is_its_value_in_units(spec: str) -> None:
    """Every finite value of the element format, both signs, on divisors of 1 and 2^-5: the
    integer is the value over the format's smallest positive value, on every path (and NaN,
    the format's NaN code or its largest, as the reference has it)."""
    view = _view(spec, "nearest")
    table = view.scaling.element.finite.float()
    values = torch.cat([table, -table, table.new_tensor([-0.0])])
    for divisor in (1.0, 2.0**-5):
        x = torch.cat([values * divisor, torch.tensor([math.nan, -math.nan])])
        scales = torch.full((-(-len(x) // view.block),), divisor)
        got = _each_path(partial(view.encode, x, scales, KEY, 0, torch.int32), x)
        _assert_same(got, divisor)
        units = got["torch"][: len(values)].double()
        assert torch.equal(units, values.double() / view.unit)
    # ties between neighbours times divisors that are not powers of two: x / d lands on the
    # tie where x * (1 / d), one bit off, would round the other way
    ties = (table[1:] + table[:-1]) / 2
    ties = torch.cat([ties, -ties])
    for divisor in (0.7, 3.3, 1.1e-3):
        scales = torch.full((-(-len(ties) // view.block),), divisor)
        x = ties * divisor
        _assert_same(_each_path(partial(view.encode, x, scales, KEY, 0, torch.int32), x), divisor)
    top = torch.full((view.block,), view.top, dtype=torch.int32)  # K ranks at +top give +max
    ones = torch.ones(1)
    got = _each_path(partial(_decode, view, top * 3, ones, 3), top)
    _assert_same(got, "top")
    assert bool((got["torch"] == view.scaling.element.max_normal).all())


@pytest.mark.parametrize("spec", FORMATS)
def test_a_range_draws_by_its_global_element_index(spec: str) -> None:
    """A block-aligned range [a, n) at offset base + a encodes as elements a.. of the whole at
    offset base, on every path: the pipelined allreduce's chunks draw what one call draws."""
    view = _view(spec, "stochastic")
    n = 40 * view.block + 3
    x = _random(n, seed=11)
    shared = _shared(view, [x])
    first = 7 * view.block
    for base in (0, 2**32 - 3 * view.block):
        whole = _each_path(partial(view.encode, x, shared, KEY, base, torch.int32), x)
        rest = (x[first:], shared[first // view.block :], KEY, base + first, torch.int32)
        part = _each_path(partial(view.encode, *rest), x)
        _assert_same(whole, base)
        for name in PATHS:
            assert torch.equal(part[name], whole[name][first:]), (name, base)
        # and the draws matter: keyed from 0 the range rounds otherwise
        with _path("torch", x):
            unkeyed = view.encode(x[first:], shared[first // view.block :], KEY, 0, torch.int32)
        assert not torch.equal(unkeyed, whole["torch"][first:])


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize(
    "spec", ["mx:rounding=stochastic", "fp8:block_size=128,rounding=stochastic",
             "nvfp4:scope=global,rounding=stochastic"],
)  # fmt: skip
def test_pipelined_stochastic_allreduce_equals_one_allreduce(spec: str, backend: str) -> None:
    """integer-allreduce with overlap 4 draws each chunk at its own offset: the same means as
    one allreduce, bit for bit, on the torch reference and on the C loops."""
    k, n = 3, 5000

    def rank_main(comm: ThreadComm, overlap: int) -> torch.Tensor:
        agg = aggregate.build(
            "integer-allreduce", comm, from_spec(spec), n, params={"overlap": overlap}
        )
        g = torch.randn(n, generator=torch.Generator().manual_seed(comm.rank))
        timer = PhaseTimer(torch.device("cpu"))
        timer.start()
        return agg.aggregate(g, 7, timer)

    with native.backend(backend), cuda_emulate.emulation("off"):  # (one switch for all ranks)
        one = run_ranks(k, lambda comm: rank_main(comm, 1))
        piped = run_ranks(k, lambda comm: rank_main(comm, 4))
    for a, b in zip(one, piped, strict=True):
        assert torch.equal(a, b)


@needs_gpu
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("spec", FORMATS)
def test_gpu_ends_match_the_reference(spec: str, rounding: str) -> None:
    """On the device: CuPy's build of the kernels, and the GPU's own float64 arithmetic."""
    view = _view(spec, rounding)
    xs = _ranks(view, 4097, seed=3)
    shared = _shared(view, xs)
    amax = torch.stack([view.local_scales(x) for x in xs]).amax(0)
    with native.backend("native"):
        assert torch.equal(
            view.share(amax.cuda()).cpu().view(torch.int32), shared.view(torch.int32)
        )
    for dtype in DTYPES:
        with native.backend("torch"):
            want = view.encode(xs[0], shared, KEY, 2**32 - 9, dtype)
            mean = view.decode(want * 2, shared, 3, torch.empty(4097))
        with native.backend("native"):
            dev = [t.cuda() for t in (xs[0], shared, want)]
            got = view.encode(dev[0], dev[1], KEY, 2**32 - 9, dtype)
            got_mean = view.decode(dev[2] * 2, dev[1], 3, torch.empty(4097, device="cuda"))
        assert torch.equal(got.cpu(), want), dtype
        assert torch.equal(got_mean.cpu().view(torch.int32), mean.view(torch.int32)), dtype
