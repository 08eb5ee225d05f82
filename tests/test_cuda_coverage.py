"""Every line of the CUDA kernels runs in the normal suite: gcov on the emulated build.

``make cuda-coverage`` prints the same report (qbench/compress/cuda_coverage.py).
"""

from __future__ import annotations

import shutil

import pytest

from qbench.compress import cuda, cuda_coverage


def _skip_reason() -> str:
    if shutil.which("gcov") is None:
        return "gcov not found (it comes with gcc)"
    reason = cuda.emulator_unavailable()
    return f"CUDA emulator unavailable: {reason}" if reason else ""


_SKIP = _skip_reason()


@pytest.mark.skipif(bool(_SKIP), reason=_SKIP)
def test_every_kernel_line_runs() -> None:
    report = cuda_coverage.measure()
    names = {f.path.name for f in report.files}
    assert {"qsgd.cu", "onebit.cu", "qsgd_math.h"} <= names, report.render()
    assert report.lines > 200, report.render()
    assert report.covered == report.lines, report.render()
