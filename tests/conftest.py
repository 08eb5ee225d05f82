"""Session settings of the test suite.

Without a C compiler the sweeps in the tests would stop at the pre-flight ("compiled CPU
kernels: no C compiler"), as a user's would. The tests then sweep the torch codecs instead
(``QBENCH_COMPRESS_BACKEND=torch``, the fix that line names) and the tests of the compiled
kernels skip, saying so (tests/compiled.py); the header of the run says which. A backend set
by hand is left alone.
"""

from __future__ import annotations

import os

import pytest

from qbench.catalog import toolchain

_TORCH_CODECS = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    if toolchain.find_c_compiler() is None and toolchain.BACKEND_ENV not in os.environ:
        os.environ[toolchain.BACKEND_ENV] = "torch"  # inherited by every sweep's subprocess
        config.stash[_TORCH_CODECS] = True


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.stash.get(_TORCH_CODECS, False):
        return (
            f"no C compiler: sweeps use the torch codecs ({toolchain.BACKEND_ENV}=torch) and "
            "the compiled-kernel tests skip"
        )
    return None
