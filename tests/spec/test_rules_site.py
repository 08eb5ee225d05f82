"""One rule site (issue 45 item 2): every reason a combination cannot run comes from
``qbench.spec.rules.why_not``; no planner, launcher, bench or loop keeps a rule of its own."""

from __future__ import annotations

import ast
from pathlib import Path

from qbench import catalog
from qbench.spec import rules, scenario
from qbench.spec.matrix import expand
from tests.paths import PKG

RULES_PKG = PKG / "spec" / "rules"
RULE_NAMES = ("why_not", "incompatibility", "unsupported")
WRAPPERS = {"costmodel/schemes.py": ["incompatibility"]}
"""Callers of ``why_not`` under a rule's name, each with its reason: the cost model's adds its
projected native low-precision allreduce, a scheme no run has and the catalog does not know."""


def _rule_like_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.name.strip("_") in RULE_NAMES or node.name.endswith("_problem"))
    ]


def test_no_module_outside_the_rules_package_defines_a_rule() -> None:
    """Caught before: the matrix's eight ``_*_problem`` functions, ``shaped.unsupported``,
    ``bench comm``'s ``_no_mean`` filter and async-ps's run-time telemetry refusal."""
    found = {
        str(p.relative_to(PKG)): names
        for p in sorted(PKG.rglob("*.py"))
        if RULES_PKG not in p.parents and (names := _rule_like_functions(p))
    }
    assert found == WRAPPERS


def test_every_exclusion_of_a_scenario_is_why_not_or_the_users_selection() -> None:
    """Runs excluded for a rule of each module (methods, links, workload, devices), and one by
    the scenario's own exclude: each reason is the rules' text or the selection's."""
    text = """name: t
model: logreg
dataset: digits
world_size: [2, 3]
nodes: [1, 2]
backend: [gloo, mpi, nccl]
device: cpu
scheme: [allreduce, reduce-broadcast, async-ps]
compressor: [none, {name: qsgd, bits: 4}]
telemetry: true
exclude: [{backend: mpi, scheme: allreduce}]
"""
    m = expand(scenario.loads(text))
    reasons = {e.reason for e in m.excluded}
    assert {
        "world_size 3 does not split evenly over nodes 2",
        "nccl reduces GPU tensors only; use device cuda (or auto) or backend gloo",
        "async-ps records no per-layer telemetry; remove `telemetry` from the scenario for "
        "async-ps runs",
        "dropped by exclude entry 1 {'backend': 'mpi', 'scheme': 'allreduce'}",
    } <= reasons
    qsgd = catalog.compressor({"name": "qsgd", "bits": 4})
    assert rules.why_not(rules.Candidate(backend="gloo", scheme="allreduce", compressor=qsgd))
    assert rules.why_not(
        rules.Candidate(backend="nccl", scheme="allreduce", compressor=catalog.compressor("none"),
                        world_size=2, network={"bandwidth": "1gbit"}, device="cuda")
    ) == rules.emulation_problem("nccl")  # fmt: skip


def test_bench_comm_asks_the_rules_for_one_collective_call() -> None:
    none = catalog.compressor("none")
    for scheme in ("gossip", "async-ps", "ddp"):
        assert rules.why_not(rules.Candidate(backend="gloo", scheme=scheme, compressor=none,
                                             collective=True)), scheme  # fmt: skip
    assert rules.why_not(rules.Candidate(backend="gloo", scheme="gossip", compressor=none)) is None


def test_fsdp_refuses_weight_rounding_and_the_replicas_take_it() -> None:
    """`weights: {bits: N}` rounds a replica after its step; FSDP keeps shards (rules/workload)."""
    none = catalog.compressor("none")
    fsdp = rules.Candidate(backend="gloo", scheme="fsdp", compressor=none, weight_bits=8)
    assert rules.why_not(fsdp) == (
        "weights: {bits: 8} rounds a replica's parameters after the step; FSDP keeps shards, "
        "not replicas; drop `weights:` for fsdp"
    )
    flat = rules.Candidate(backend="gloo", scheme="allreduce", compressor=none, weight_bits=8)
    assert rules.why_not(flat) is None
    assert rules.why_not(rules.Candidate(backend="gloo", scheme="fsdp", compressor=none)) is None
