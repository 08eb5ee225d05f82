"""Each scheme's traffic declared once, in the catalog (issue 45 item 3): the cost model reads
it and branches on no scheme's name, so a scheme that declares traffic is timed with no edit
of qbench.costmodel. Numbers written by hand from the scheme definitions."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from qbench import catalog
from qbench.catalog.schemes import traffic
from qbench.catalog.schemes.collectives import ring_allreduce_bytes
from qbench.costmodel import Config, Scheme, predict
from qbench.costmodel.model import CollectiveFit, CostModel
from qbench.spec.network import Link
from tests.paths import PKG

COSTMODEL = PKG / "costmodel"
NONE = catalog.compressor("none")
Q4 = {"name": "qsgd", "bits": 4}


def _literal_scheme_branches(path: Path) -> list[str]:
    """Comparisons of a scheme name with a literal catalog scheme name (``scheme.name ==
    "hierarchical"``, ``name in ("allgather", ...)``)."""
    names = set(catalog.SCHEMES)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        literals = [c.value for s in sides for c in ast.walk(s)
                    if isinstance(c, ast.Constant) and c.value in names]  # fmt: skip
        if literals:
            found.append(f"{path.name}:{node.lineno} {literals}")
    return found


def test_the_cost_model_branches_on_no_schemes_name() -> None:
    """Before: 16 such branches (formulas, phases, predict, points, schemes)."""
    found = [f for p in sorted(COSTMODEL.rglob("*.py")) for f in _literal_scheme_branches(p)]
    assert found == []


def _x(k: int = 4, n: float = 1000.0, comp: object = Q4, **kw: object) -> traffic.Exchange:
    spec = catalog.compressor(comp)
    bits = 8 * spec.wire_bytes(2**20) / 2**20
    return traffic.Exchange(ranks=k, values=n, compressor=spec, bits_per_value=bits, **kw)


def test_reduce_broadcast_declares_its_exchange_and_codec_work() -> None:
    t = catalog.SCHEMES["reduce-broadcast"].traffic(_x(k=4, n=1000.0))
    (phase,) = t.phases
    payload = 1000 * (4 + 32 / 512) / 8  # 4-bit levels + an fp32 scale per 512 values
    # alltoallv of the 4 ranges, then the allgatherv of the owners' means: 3/4 P each
    assert (phase.collective, phase.msgs, phase.calls) == ("exchange", 6, (0.75 * payload,) * 2)
    assert (t.encode.units, t.encode.calls) == (1250.0, 5)  # K ranges + the owner's re-encode
    assert (t.decode.units, t.decode.calls, t.decode.passes) == (2000.0, 8, 1)


def test_hierarchical_declares_a_phase_per_level_and_its_lanes() -> None:
    """2 nodes x 2 ranks, fp32 inside, reduce-scatter between: an exchange of 4 n bytes among
    G = 2 inside; between nodes, 2 lanes share a reduce-broadcast of the whole payload."""
    t = catalog.SCHEMES["hierarchical"].traffic(
        _x(k=4, n=1000.0, comp="none", nodes=2, params={"intra": "none", "inter": "reduce-scatter"})
    )  # fmt: skip
    inside, between = t.phases
    assert (inside.level, inside.collective, inside.calls) == ("intra", "exchange", (2000.0,) * 2)
    assert (between.level, between.lanes, between.calls) == ("inter", 2, (2000.0,) * 2)
    assert t.wire == 4000.0 + 4000.0 / 2
    assert (t.encode.scheme, t.encode.ranks, t.encode.values) == ("reduce-broadcast", 2, 500.0)
    assert t.levelled and not catalog.SCHEMES["allreduce"].traffic(_x()).levelled


def test_integer_allreduce_pays_the_narrowest_integer_the_backend_sums() -> None:
    """4-bit levels (|l| <= 7) on 4 ranks sum within int8 (28 <= 127): 1 byte a value, plus
    an fp32 scale per 512 values, in two ring allreduces."""
    t = catalog.SCHEMES["integer-allreduce"].traffic(_x(k=4, n=1024.0))
    (phase,) = t.phases
    assert phase.calls == (ring_allreduce_bytes(8.0, 4), ring_allreduce_bytes(1024.0, 4))
    assert t.payload_bits == 8 + 32 / 512


TOY = replace(
    catalog.SCHEMES["allreduce"], name="toy-ring", params=(), display=None,
    traffic=lambda x: replace(
        traffic.allreduce(x), phases=(traffic.Phase("allreduce", 1, (3.0 * x.payload,)),)
    ),
)  # fmt: skip
"""A scheme the cost model has never heard of: one message step, three payloads on the wire."""


@pytest.fixture
def toy() -> Iterator[None]:
    catalog.register_scheme(TOY)
    yield
    catalog.SCHEMES.pop("toy-ring", None)  # type: ignore[attr-defined]


def test_a_new_scheme_is_timed_from_its_declared_traffic_alone(toy: None) -> None:
    fit = CollectiveFit(
        backend="gloo", network="unshaped", collective="allreduce", alpha_s=1e-3,
        beta_s_per_byte=1e-6, r2=1.0, points=2, rel_err_median=0.0, rel_err_max=0.0,
    )  # fmt: skip
    cfg = Config(scheme=Scheme.of(catalog.scheme({"name": "toy-ring"})), compressor=NONE,
                 network=Link(), world_size=4, numel=1000, compute_s=0.0, step_s=0.0)  # fmt: skip
    p = predict(CostModel(collectives=[fit]), cfg)
    assert p.wire_bytes == 12_000.0  # 3 x 4000 bytes of fp32
    assert p.comm_s == pytest.approx(1e-3 + 12_000 * 1e-6)
