"""The catalog: one entry per compressor and scheme, read by everything else (no torch).

The codecs must build payloads of exactly the catalog's wire layout, declare exactly its
parameters, and the planner's rules give the reasons written out here by hand.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

from qbench import catalog, compress
from qbench.catalog import specs
from qbench.errors import UserError
from qbench.spec import rules

SIZES = [0, 1, 7, 8, 9, 63, 64, 65, 511, 512, 513, 1000, 4097]


def test_the_catalog_and_the_planner_import_no_torch() -> None:
    code = (
        "import sys; import qbench.catalog, qbench.spec.rules, qbench.spec.matrix; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", sorted(compress.COMPRESSORS))
def test_every_codec_declares_exactly_its_catalog_parameters(name: str) -> None:
    codec = compress.COMPRESSORS[name]
    own = [c for c in codec.__mro__ if issubclass(c, compress.Compressor)][:-1]  # not the base
    declared = {k for c in own for k in vars(c).get("__annotations__", {})} - {"name", "wire_dtype"}
    assert declared == {p.name for p in catalog.COMPRESSORS[name].params}


@pytest.mark.parametrize(
    "spec",
    [{"name": "none"}, {"name": "fp16"}, {"name": "bf16"},
     {"name": "qsgd", "bits": 3, "bucket_size": 7}, {"name": "qsgd", "bits": 16},
     {"name": "qsgd", "bits": 1, "bucket_size": 64}, {"name": "onebit", "bucket_size": 5},
     {"name": "fixedpoint", "bits": 11}, {"name": "fixedpoint", "bits": 16, "delta": 0.5},
     {"name": "fixedpoint", "bits": 3}, {"name": "topk", "ratio": 0.07},
     {"name": "fp8"}, {"name": "fp8", "format": "e5m2", "block_size": 7},
     {"name": "mx"}, {"name": "mx", "element": "e3m2", "error_feedback": True},
     {"name": "mx", "element": "e4m3"}, {"name": "nvfp4", "rounding": "stochastic"}],
    ids=lambda s: "-".join(map(str, s.values())),
)  # fmt: skip
def test_payloads_have_the_catalogs_wire_bytes(spec: dict[str, Any]) -> None:
    codec = compress.from_spec(spec)
    checked = catalog.compressor(spec)
    for n in SIZES:
        codec.reset()  # error feedback keeps one residual per slot and size
        payload = codec.encode(torch.randn(n, generator=torch.Generator().manual_seed(n)))
        assert payload.nbytes == checked.wire_bytes(n), n


def test_granularity_of_every_default_and_scope() -> None:
    # the built-in ones (installed plug-ins join catalog.COMPRESSORS too)
    built_in = ("none", "fp16", "bf16", "qsgd", "onebit", "fixedpoint", "topk", "adaptive",
                "powersgd", "fp8", "mx", "nvfp4")  # fmt: skip
    got = {n: catalog.compressor(n).granularity for n in built_in}
    assert got == {
        "none": "value", "fp16": "value", "bf16": "value", "qsgd": "bucket", "onebit": "bucket",
        "fixedpoint": "tensor", "topk": "tensor", "adaptive": "tensor", "powersgd": "tensor",
        "fp8": "tensor", "mx": "bucket", "nvfp4": "tensor",
    }  # fmt: skip
    assert catalog.compressor("fp8:block_size=128").granularity == "bucket"
    assert catalog.compressor("nvfp4:scope=global").granularity == "call"
    if "scaledsign" in catalog.COMPRESSORS:  # the plug-in example, installed by `make venv`
        assert catalog.compressor("scaledsign").granularity == "bucket"
    assert catalog.compressor("topk:scope=global").granularity == "call"
    assert catalog.compressor("qsgd:align=tensor").granularity == "tensor"
    assert catalog.compressor("fixedpoint:delta=0.5").granularity == "value"
    assert set(got.values()) <= set(catalog.GRANULARITIES)
    with pytest.raises(UserError, match=r"with delta 0\.5 every value is rounded on its own"):
        catalog.compressor({"name": "fixedpoint", "delta": 0.5, "scope": "global"})


def test_wire_bytes_written_out_by_hand() -> None:
    q4 = catalog.compressor({"name": "qsgd", "bits": 4, "bucket_size": 512})
    assert q4.wire_bytes(1000) == 500 + 2 * 4  # 4 bits each, two buckets of one fp32 scale
    assert catalog.compressor("qsgd:bits=16").wire_bytes(10) == 20 + 4
    assert catalog.compressor("onebit").wire_bytes(100) == 13 + 2 * 2 * 4  # 2 buckets of 64
    assert catalog.compressor("topk:ratio=0.07").wire_bytes(100) == 7 * 8  # 7 values + indices
    assert catalog.compressor("fixedpoint:bits=11").wire_bytes(8) == 11 + 2  # + the exponent
    assert catalog.compressor("none").wire_bytes(10) == 40  # fp32: 4 bytes a value
    assert catalog.compressor("fp16").wire_bytes(10) == catalog.compressor("bf16").wire_bytes(10)
    assert catalog.compressor("bf16").wire_bytes(10) == 20
    assert catalog.compressor("adaptive").wire_bytes(8) is None  # depends on the data
    assert catalog.compressor("powersgd").wire_bytes(8) is None


# spec: the payload of 1000 values, buffer by buffer in wire order (name, dtype, count), as each
# codec module's docstring describes its wire; codecs read received buffers by these names.
LAYOUTS = {
    "none": [("values", "float32", 1000)],
    "fp16": [("values", "float16", 1000)],
    "bf16": [("values", "bfloat16", 1000)],
    # ceil(1000 x 4 / 8) = 500 bytes of codes, ceil(1000 / 512) = 2 scales
    "qsgd": [("levels", "uint8", 500), ("scales", "float32", 2)],
    # 16-bit codes: 2 bytes each; 8 buckets of 128
    "qsgd:bits=16,bucket_size=128": [("levels", "uint8", 2000), ("scales", "float32", 8)],
    # ceil(1000 / 8) = 125 bytes of signs; ceil(1000 / 64) = 16 buckets, 2 means each
    "onebit": [("signs", "uint8", 125), ("means", "float32", 32)],
    # 11-bit codes: 1375 bytes; the auto step's exponent
    "fixedpoint:bits=11": [("levels", "uint8", 1375), ("exponent", "int16", 1)],
    # 16 bits: int16 codes; a given step sends no exponent
    "fixedpoint:bits=16,delta=0.5": [("levels", "int16", 1000)],
    # ceil(0.07 x 1000) = 70 values and their indices
    "topk:ratio=0.07": [("values", "float32", 70), ("indices", "int32", 70)],
    # a code byte per value; one fp32 scale (per tensor), or ceil(1000 / 128) = 8 block scales
    "fp8": [("codes", "uint8", 1000), ("scales", "float32", 1)],
    "fp8:format=e5m2,block_size=128": [("codes", "uint8", 1000), ("scales", "float32", 8)],
    # MXFP4: 4-bit codes, 500 bytes; ceil(1000 / 32) = 32 E8M0 bytes
    "mx": [("codes", "uint8", 500), ("scales", "uint8", 32)],
    # MXFP6: 6-bit codes, 750 bytes; MXFP8: a byte each
    "mx:element=e2m3": [("codes", "uint8", 750), ("scales", "uint8", 32)],
    "mx:element=e5m2": [("codes", "uint8", 1000), ("scales", "uint8", 32)],
    # NVFP4: 500 bytes of codes, ceil(1000 / 16) = 63 E4M3 block scales, the fp32 tensor scale
    "nvfp4": [("codes", "uint8", 500), ("scales", "uint8", 63), ("tensor_scale", "float32", 1)],
}


@pytest.mark.parametrize("spec", sorted(LAYOUTS))
def test_wire_layouts_written_out_by_hand(spec: str) -> None:
    checked = catalog.compressor(spec)
    assert checked.entry.wire is not None
    assert checked.entry.wire(checked.params, 1000) == LAYOUTS[spec]


def test_which_payloads_integer_allreduce_can_sum() -> None:
    def why(spec: str) -> str | None:
        checked = catalog.compressor(spec)
        return checked.entry.integer_levels(checked.params)

    assert why("qsgd:bits=2") is None  # levels -1..1: the narrowest that sums
    assert why("none") is None  # fp32 groups take a plain allreduce
    assert why("qsgd:bits=1") == (
        "it needs qsgd bits >= 2 (levels -L..L, L = 2^(bits-1) - 1), got bits 1; e.g. `bits: 2`"
    )
    assert why("qsgd:norm=l2") == (
        "it scales buckets by the max |x| over ranks, got qsgd norm l2; use `norm: max`"
    )
    assert why("qsgd:align=tensor") == (
        "its ranks share one grid of contiguous buckets over the slice, got qsgd align tensor; "
        "use `align: contiguous`"
    )
    assert why("fp16") == why("onebit") == "its payload is not integer levels"
    # the float formats on shared block scales, in units of their smallest value
    assert why("mx") is why("mx:element=e4m3") is why("fp8:block_size=32") is None
    assert why("nvfp4:scope=global") is None
    assert why("mx:element=e5m2") == (
        "e5m2 values span 2^-16 .. 57344, more than an int32 sum holds; use e4m3 (or "
        "reduce-broadcast)"
    )
    assert "set `block_size` (e.g. 128)" in (why("fp8") or "")
    assert "use `scope: global`" in (why("nvfp4") or "")
    grid = {s: catalog.compressor(s).entry.integer_grid(catalog.compressor(s).params)
            for s in ("qsgd:bits=8", "mx", "mx:element=e4m3", "mx:element=e3m2",
                      "mx:element=e2m3", "nvfp4:scope=global", "fp8:block_size=64")}  # fmt: skip
    # 6 / 0.5 = 12; 448 / 2^-9; 28 / 2^-4; 7.5 / 2^-3
    assert grid == {"qsgd:bits=8": (127, 512), "mx": (12, 32), "mx:element=e4m3": (229376, 32),
                    "mx:element=e3m2": (448, 32), "mx:element=e2m3": (60, 32),
                    "nvfp4:scope=global": (12, 16), "fp8:block_size=64": (229376, 64)}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "label"),
    [("none", "fp32"), ("fp16", "fp16"), ("qsgd", "qsgd-4b-b512"),
     ("qsgd:bits=2,norm=l2,layout=sign", "qsgd-2b-b512-l2-sign"), ("onebit", "1bit-b64"),
     ("onebit:columns=true,error_feedback=false", "1bit-col-noef"),
     ("fixedpoint:scope=global", "fixed-8b"), ("fixedpoint", "fixed-8b-layer"),
     ("fixedpoint:delta=0.25", "fixed-8b-d0.25"), ("topk:scope=global", "topk-1%"),
     ("topk", "topk-1%-layer"),
     ("adaptive:scope=global,entropy_grid=symmetric", "adaptive-c6-m4-f3%"),
     ("adaptive", "adaptive-c6-m4-f3%-layer-minmax"),
     ("adaptive:entropy_grid=symmetric", "adaptive-c6-m4-f3%-layer"),
     ("qsgd:align=tensor", "qsgd-4b-b512-tensor"), ("powersgd:rank=2", "powersgd-r2"),
     ("fp8", "fp8-e4m3"), ("fp8:format=e5m2,block_size=128,rounding=stochastic",
     "fp8-e5m2-b128-sr"), ("mx", "mxfp4"), ("mx:element=e4m3", "mxfp8-e4m3"),
     ("mx:element=e2m3,error_feedback=true", "mxfp6-e2m3-ef"), ("nvfp4", "nvfp4"),
     ("nvfp4:scope=global,rounding=stochastic", "nvfp4-global-sr")],
)  # fmt: skip
def test_labels_are_stable(spec: str, label: str) -> None:
    assert catalog.compressor_label(spec) == label  # run ids contain them: never change one


@pytest.mark.parametrize(
    "spec",
    ["none", "fp16", "bf16", "qsgd:bits=16,bucket_size=7", "qsgd:bits=2,norm=l2,layout=sign",
     "onebit:bucket_size=32,error_feedback=false", "onebit:columns=true",
     "fixedpoint:bits=12,delta=0.0625", "fixedpoint:bits=3", "fixedpoint:scope=global",
     "topk:ratio=0.005", "topk:error_feedback=false", "topk:scope=global,error_feedback=false",
     "adaptive:sample_fraction=0.1,probe_bits=3,floor_bits=2", "adaptive:scope=global",
     "qsgd:bits=3,align=tensor,layout=sign,norm=l2",
     "powersgd:rank=4,warm_start=false", "fp8", "fp8:format=e5m2,block_size=64,error_feedback=true",
     "mx:element=e3m2,rounding=stochastic", "mx:element=e5m2", "mx",
     "nvfp4:scope=global,rounding=stochastic,error_feedback=true"],
)  # fmt: skip
def test_labels_read_back_to_their_compressor(spec: str) -> None:
    c = catalog.compressor(spec)
    back = catalog.from_label(c.label)
    if c.name == "onebit" and c.params["columns"]:  # per column: the bucket is the column
        assert back.params["columns"] and back.name == "onebit"
    else:
        assert (back.name, back.params) == (c.name, c.params)
    with pytest.raises(UserError, match="no compressor has the label 'qsgd-4b'"):
        catalog.from_label("qsgd-4b")


@pytest.mark.parametrize("entry", [*catalog.COMPRESSORS.values(), *catalog.SCHEMES.values()])
def test_defaults_and_examples_pass_their_own_rules(entry: Any) -> None:
    owner = entry.name
    for p in entry.params:
        assert p.check(owner, p.default) == p.default or p.default is None
        p.check(owner, p.example_value)


def test_cli_spec_syntax_round_trips_and_works_in_yaml() -> None:
    spec = specs.parse_cli("qsgd:bits=4,bucket_size=512,norm=l2")
    assert spec == {"name": "qsgd", "bits": 4, "bucket_size": 512, "norm": "l2"}
    assert specs.parse_cli(specs.to_cli(spec)) == spec
    assert specs.mapping("topk:ratio=0.1") == {"name": "topk", "ratio": 0.1}
    assert specs.mapping("none") == {"name": "none"}
    with pytest.raises(UserError, match="'bits' is not KEY=VALUE"):
        specs.parse_cli("qsgd:bits")


@pytest.mark.parametrize(
    ("raw", "message"),
    [({"name": "qsgd", "bukcet_size": 8}, "unknown parameter 'bukcet_size' (did you mean "
      "'bucket_size'?); valid: bits, bucket_size, norm, layout"),
     ({"name": "qsgd", "bits": 12}, "qsgd: bits must be 1..8 or 16, got 12; e.g. `bits: 4`"),
     ({"name": "qsgd", "bits": "4"}, "qsgd: bits must be an integer (1..8 or 16), got '4' (str)"),
     ({"name": "qsgd", "seed": 1}, "qsgd: seed is the run's"),
     ({"name": "qsgdd"}, "unknown compressor 'qsgdd' (did you mean 'qsgd'?); valid: adaptive"),
     ({"name": "adaptive", "floor_bits": 10, "probe_bits": 8}, "must be <= 16, got 10 + 8"),
     ({"bits": 4}, "compressor {'bits': 4} has no name")],
)  # fmt: skip
def test_compressor_errors_are_one_line_naming_value_and_fix(raw: Any, message: str) -> None:
    with pytest.raises(UserError) as e:
        catalog.compressor(raw)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_scheme_parameters_are_validated_with_defaults() -> None:
    assert catalog.scheme("reduce-broadcast:overlap=4").params["overlap"] == 4
    assert catalog.scheme({"name": "gossip"}).params == {
        "topology": "ring", "algorithm": "choco", "gamma": 1.0,
    }  # fmt: skip
    down = catalog.scheme({"name": "parameter-server", "down": "qsgd:bits=8"}).params["down"]
    assert down == {"name": "qsgd", "bits": 8}
    with pytest.raises(UserError, match=r"async-ps: down .* cannot be topk"):
        catalog.scheme({"name": "async-ps", "down": {"name": "topk"}})
    with pytest.raises(UserError, match="scheme reduce-broadcast: overlap must be a chunk count"):
        catalog.scheme({"name": "reduce-broadcast", "overlap": 0})


QSGD4 = {"name": "qsgd", "bits": 4}


@pytest.mark.parametrize(
    ("backend", "scheme", "comp", "ws", "reason"),
    [("gloo", "allreduce", QSGD4, 2, "allreduce sums raw buffers and cannot sum packed qsgd"),
     ("mpi", "allreduce", {"name": "bf16"}, 2, "MPI cannot sum bf16 buffers"),
     ("gloo", "integer-allreduce", {"name": "onebit"}, 2, "cannot sum onebit"),
     ("gloo", "integer-allreduce", {"name": "qsgd", "bits": 1}, 2, "needs qsgd bits >= 2"),
     ("gloo", "integer-allreduce", {"name": "qsgd", "norm": "l2"}, 2, "use `norm: max`"),
     ("gloo", "integer-allreduce", {"name": "qsgd", "align": "tensor"}, 2,
      "use `align: contiguous`"),
     ("gloo", "gossip", {"name": "topk", "error_feedback": False}, 4, None),
     ("gloo", "gossip", {"name": "topk"}, 4, "set `error_feedback: false` on topk"),
     ("gloo", "async-ps", QSGD4, 1, "world_size >= 2, got 1"),
     ("nccl", "async-ps", QSGD4, 2, "which nccl cannot"),
     ("gloo", "reduce-broadcast", {"name": "powersgd"}, 2, "use `scheme: ddp`"),
     ("mpi", "ddp", {"name": "none"}, 2, "mpi has no DDP"),
     ("gloo", "reduce-broadcast", QSGD4, 2, None),
     ("gloo", "ddp", {"name": "powersgd"}, 2, None),
     ("gloo", "integer-allreduce", {"name": "none"}, 2, None)],
)  # fmt: skip
def test_rules_give_their_reasons(
    backend: str, scheme: str, comp: dict[str, Any], ws: int, reason: str | None
) -> None:
    why = rules.incompatibility(backend, scheme, catalog.compressor(comp), world_size=ws)
    assert (why is None) if reason is None else (reason in str(why)), why


def test_torus_rule_needs_two_factors() -> None:
    params = {"topology": "torus"}
    assert (
        rules.incompatibility(
            "gloo", "gossip", catalog.compressor("none"), world_size=6, params=params
        )
        is None
    )
    why = rules.incompatibility(
        "gloo", "gossip", catalog.compressor("none"), world_size=7, params=params
    )
    assert "torus needs world_size = r x c" in str(why)


def test_per_tensor_pieces_may_be_empty_but_must_add_up() -> None:
    """A layer group can hold a tensor with no values (a zero-size bias): its piece is 0."""
    checked = catalog.compressor("qsgd:align=tensor")
    entry, params = checked.entry, checked.params
    assert entry.pieces(params, 5, [0, 5, 0]) == (0, 5, 0)
    assert entry.pieces(params, 5, None) == (5,)
    for bad in ([6, -1], [2, 2]):
        with pytest.raises(ValueError) as err:
            entry.pieces(params, 5, bad)
        assert str(err.value) == f"qsgd: pieces {bad} do not add up to 5"
