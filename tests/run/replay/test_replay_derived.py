"""A timeline derived from FLOPs (``qbench timeline``, qbench.run.replay.derived) against FLOPs
counted independently: ``torch.utils.flop_counter`` on the model at the run's batch size, one
forward and one forward + backward of the run's loss. docs/results/replay.md's H100 sweep rests
on these times (issue 44 item 5); the other timeline test reads the FLOPs from the same
``model_stats`` that ``derived`` uses, so a wrong count would pass it."""

from __future__ import annotations

import importlib.util

import pytest

from qbench.run import replay
from qbench.spec import scenario
from qbench.spec.matrix import expand
from qbench.spec.runspec import RunSpec
from tests.paths import ROOT

TFLOPS = 2.0


def _counted(spec: RunSpec) -> tuple[float, float]:
    """(forward, backward) FLOPs of one batch, counted on real tensors by the script that
    docs/results/replay.md's H100 figures come from (benchmarks/h100_compute.py)."""
    path = ROOT / "benchmarks" / "h100_compute.py"
    loader = importlib.util.spec_from_file_location("h100_compute", path)
    assert loader is not None and loader.loader is not None
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    forward, both = script.counted(spec)
    return forward, both - forward


@pytest.mark.parametrize(
    "model", ["{name: synthetic, params: 200k, gflops: 0.01}", "cnn"]
)  # fmt: skip
def test_derived_times_are_the_counted_flops_at_the_stated_speed(model: str) -> None:
    """Forward: exactly the counted forward FLOPs of the batch / the speed. Backward: the
    derived 2x forward within 10 % of the counted backward (the synthetic model: 1.96x; cnn:
    1.87x, its first convolution's input takes no gradient)."""
    text = f"name: t\nmodel: {model}\nworld_size: 1\nbatch_size: 16\ncompute: replay\n"
    spec = expand(scenario.loads(text)).runs[0]
    tl = replay.derived(spec, TFLOPS, 1.0, "Test GPU (stated)")
    forward, backward = _counted(spec)
    assert tl.forward_s * TFLOPS * 1e12 == pytest.approx(forward, rel=1e-6)
    assert tl.backward_s * TFLOPS * 1e12 == pytest.approx(backward, rel=0.10)
