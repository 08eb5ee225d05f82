"""The CUDA sources compile under NVRTC, as CuPy compiles them on a device, without a GPU.

The emulator builds kernels/*.cu as host C++, which sees the C library; NVRTC does not. On
2026-11-29 a lent H200 refused lowfloat.cu (``int8_t`` undefined) although every emulator test
passed; these cases fail on that source (shown in docs/testing.md). NVRTC comes with `make venv`
(the dev extra), so a missing library fails here with the line that installs it; it never skips.
"""

from __future__ import annotations

import re

import pytest

from qbench.compress.kernels.abi import kernel_dir
from qbench.compress.kernels.cuda import _SOURCES, nvrtc


@pytest.mark.parametrize("arch", nvrtc.ARCHITECTURES)
@pytest.mark.parametrize("source", sorted(_SOURCES))
def test_every_kernel_compiles_under_nvrtc(source: str, arch: str) -> None:
    ptx = nvrtc.compile_ptx(source, arch)
    assert sorted(nvrtc.entries(ptx)) == sorted(_SOURCES[source])


def test_a_type_nvrtc_lacks_is_a_compile_error_with_the_log(tmp_path, monkeypatch) -> None:
    (tmp_path / "bad.cu").write_text('extern "C" __global__ void k(int8_t *p) { p[0] = 1; }\n')
    monkeypatch.setattr(nvrtc, "kernel_dir", lambda: tmp_path)
    with pytest.raises(nvrtc.CompileError, match=r'bad\.cu\(1\): error: .*"int8_t"'):
        nvrtc.compile_ptx("bad.cu", "compute_90")


def test_every_fixed_width_type_the_kernels_use_is_declared_for_nvrtc() -> None:
    """Names the missing typedef, where the compile test only shows NVRTC's log."""
    kdir = kernel_dir()
    rng = (kdir / "qbench_rng.h").read_text()
    nvrtc_block = rng.split("#if defined(__CUDACC_RTC__)")[1].split("#else")[0]
    declared = set(re.findall(r"typedef [\w ]+ (\w+);", nvrtc_block))
    used = {
        name
        for path in [*kdir.glob("*.cu"), *kdir.glob("*.h")]
        for name in re.findall(r"\b(u?int(?:8|16|32|64)_t)\b", path.read_text())
    }
    assert used - declared == set()
