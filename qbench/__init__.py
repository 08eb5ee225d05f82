"""qbench: benchmark data-parallel training with compressed gradient communication.

The Python API (``qbench.api``), imported on first use so that ``import qbench.catalog`` stays
light::

    out = qbench.sweep({"name": "nb", "model": "mlp", "world_size": 2}, out="results/nb")
    qbench.load(out).summary
    qbench.report(out)

``qbench.report`` is also the package of report code (``qbench.report.tables``, ...): the
package module is made callable, so both spellings work.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from qbench.api import Results as Results
    from qbench.api import load as load
    from qbench.api import report as report
    from qbench.api import sweep as sweep
    from qbench.models.workload import Workload as Workload

# The public names and where each is defined: imported on first use (PEP 562), so that
# ``import qbench`` loads neither pandas nor torch. ``report`` is the package itself (importing
# it makes it callable: _Package), which called is ``qbench.api.report``.
_LAZY: dict[str, tuple[str, str | None]] = {
    "sweep": ("qbench.api", "sweep"),
    "load": ("qbench.api", "load"),
    "Results": ("qbench.api", "Results"),
    "Workload": ("qbench.models.workload", "Workload"),
    "report": ("qbench.report", None),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'qbench' has no attribute {name!r}")
    module, attr = _LAZY[name]
    found = importlib.import_module(module)
    return found if attr is None else getattr(found, attr)


class _CallableReport(types.ModuleType):
    """The ``qbench.report`` package, which called is ``qbench.api.report``."""

    def __call__(self, directory: Any, fmt: str | None = None) -> Any:
        return importlib.import_module("qbench.api").report(directory, fmt)  # loaded as _LAZY says


class _Package(types.ModuleType):
    """``qbench`` itself: when Python binds the ``report`` subpackage to it, the subpackage
    becomes callable, so ``qbench.report(dir)`` works before and after ``qbench.report.*``
    modules are imported."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "report" and type(value) is types.ModuleType:
            value.__class__ = _CallableReport
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
