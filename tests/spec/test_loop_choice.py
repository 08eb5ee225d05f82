"""The training loop is chosen in one function, ``qbench.spec.loop.loop_for`` (issue 45 item
4): a rank builds what it names and asks nothing else of the spec."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from qbench.spec import scenario
from qbench.spec.loop import LoopChoice, loop_for
from qbench.spec.matrix import expand
from tests.paths import PKG

RUN = PKG / "run"


@pytest.mark.parametrize(
    ("scheme", "params", "compute", "want"),
    [
        ("allreduce", {}, "fp32", LoopChoice("flat")),
        ("reduce-broadcast", {"overlap": 4}, "bf16", LoopChoice("flat")),
        ("reduce-broadcast", {"backward": True}, "fp32", LoopChoice("ddp")),
        ("ddp", {}, "replay", LoopChoice("ddp", replayed=True)),
        ("allgather", {}, "replay", LoopChoice("flat", replayed=True)),
        ("gossip", {}, "fp32", LoopChoice("flat")),
        ("fsdp", {}, "fp32", LoopChoice("fsdp")),
        ("async-ps", {}, "fp32", LoopChoice("async-ps")),
    ],
)
def test_each_scheme_gets_its_loop(
    scheme: str, params: dict, compute: str, want: LoopChoice
) -> None:
    assert loop_for(scheme, params, compute) == want


def test_a_planned_run_carries_its_loop() -> None:
    text = "name: t\nmodel: mlp\nworld_size: 2\nscheme: [allreduce, ddp, async-ps]\n"
    assert [r.loop.loop for r in expand(scenario.loads(text)).runs] == ["flat", "ddp", "async-ps"]


LOOP_WORDS = {"asynchronous", "backward", "FSDP", "REPLAY"}


def _loop_decisions(path: Path) -> list[str]:
    """What chose a loop before: a scheme kind compared with "asynchronous", the FSDP name,
    the replay compute, or the backward overlap, in a module of qbench/run."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        words = {
            n.value if isinstance(n, ast.Constant) else n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(node)
            if isinstance(n, ast.Constant | ast.Name | ast.Attribute)
        }
        if words & LOOP_WORDS:
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_rank_module_chooses_a_loop_itself() -> None:
    """Before: lifecycle.run_config tested the scheme's kind, lifecycle.training_loop the FSDP
    name, the overlap and the replay compute."""
    found = [f for p in sorted(RUN.rglob("*.py")) for f in _loop_decisions(p)]
    assert found == []
