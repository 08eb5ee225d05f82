"""Every line of the CUDA kernels runs in the normal suite: gcov on the emulated build.

``make cuda-coverage`` prints the same report (qbench/compress/kernels/cuda/coverage.py).
"""

from __future__ import annotations

import shutil

import pytest

from qbench.compress.kernels.cuda import coverage as cuda_coverage
from tests import compiled


def test_every_kernel_line_runs() -> None:
    compiled.require_emulator()  # skips without a C++ compiler; a broken build fails
    if shutil.which("gcov") is None:
        pytest.skip("gcov not found: it comes with gcc (Debian: apt-get install gcc)")
    report = cuda_coverage.measure()
    names = {f.path.name for f in report.files}
    assert {"qsgd.cu", "onebit.cu", "qsgd_math.h"} <= names, report.render()
    assert report.lines > 200, report.render()
    assert report.covered == report.lines, report.render()
