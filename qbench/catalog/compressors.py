"""Every compressor once: parameters, label, wire bytes and capabilities (no torch).

The codecs in ``qbench.compress`` take their validated parameters from here and build their
payloads to the wire layout each entry names (``qbench.catalog.wire``; tests/catalog/test_catalog.py
checks payload sizes against it); the planner, the schemes, ``bench``, the cost model and the
reports read the rest. To add a compressor: an entry here and a codec module
(docs/architecture.md).

Granularity (GRANULARITIES): a compressor that chooses a scale, a width or a budget per tensor
declares ``tensor``; the schemes then hand it the tensor boundaries of every range they encode
(``pieces``), it encodes each piece on its own and the per-piece payloads travel one after the
other as one message, so message counts do not grow and ``wire_bytes(params, n, pieces)``
counts every per-piece header (docs/precision-and-layers.md).

Why one module: it is the table of every built-in compressor, one fact in one place; the
entries are read side by side (their labels and ``unlabel`` patterns must not overlap, and the
wire helpers and ``scope`` parameter are shared between entries), and splitting it per
compressor would scatter the table the planner and the reports rely on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qbench.catalog import wire
from qbench.catalog.params import Param, at_least, between, fraction, positive_finite
from qbench.catalog.registry import Registry
from qbench.catalog.wire import (
    DTYPE_BYTES,
    ELEMENTS,
    MX_BLOCK,
    NVFP4_BLOCK,
    WireBuffer,
    integer_units,
)

Params = dict[str, Any]
NOT_LEVELS = "its payload is not integer levels"
"""``integer_levels``'s answer for a codec with no integer view at all."""


@dataclass(frozen=True)
class CompressorEntry:
    name: str
    summary: str
    seed: str
    """The seed paper(s) and section it comes from ("" for baselines)."""
    codec: str
    """``module:Class`` of the torch codec (``qbench.compress``)."""
    params: tuple[Param, ...] = ()
    label: Callable[[Params], str] = lambda p: ""
    nominal_bits: Callable[[Params], float | None] = lambda p: 32.0
    """Bits per value the algorithm targets before metadata; None when it depends on shapes."""
    wire: Callable[[Params, int], list[WireBuffer]] | None = None
    """The payload of n values, buffer by buffer; None when its size depends on the data
    (:attr:`sized_by_data`), or for a ``hook_only`` entry, which has no payload of its own."""
    summable: bool = False
    """Its payload is a tensor an allreduce can sum (fp32, fp16, bf16 casts)."""
    uncompressed: bool = False
    """Every value travels as a plain float (fp32, or cast to fp16 / bf16): not compression,
    so reports take its runs as baselines (Han et al., arXiv 2407.01378: a compression study
    must beat 16-bit communication, not only fp32); ``qbench.report.speedups.uncompressed``."""
    error_feedback: Callable[[Params], bool] = lambda p: False
    """Keeps the part left out at one step and adds it at the next (state per slot)."""
    unbiased: Callable[[Params], bool] = lambda p: False
    """E[decode(encode(x))] = x (stochastic rounding without clipping)."""
    integer_levels: Callable[[Params], str | None] = lambda p: NOT_LEVELS
    """Why integer-allreduce cannot sum it as bounded integers; None when it can."""
    integer_grid: Callable[[Params], tuple[int, int]] = lambda p: (0, 0)
    """Where ``integer_levels`` is None: (the largest |integer| one rank contributes, values
    per shared scale) of its integer view (qbench.compress.integer_sum)."""
    hook_only: bool = False
    """Not a codec: a DDP communication hook (scheme ddp) whose collectives are the algorithm."""
    cross_check: Callable[[Params], str | None] = lambda p: None
    """A rule between parameters, as "the fix" text; None when fine."""
    stateful: bool = False
    """Keeps state between calls by design (error-feedback residuals), whatever its parameters."""
    unlabel: Callable[[str], Params | None] = lambda label: None
    """The inverse of ``label``: the parameters a label stands for, None when it is not this
    compressor's (tables and bench files name compressors by label; tests round-trip both)."""
    granularity: Callable[[Params], str] = lambda p: "value"
    """What one scale, width or budget covers: one of GRANULARITIES."""
    display: Callable[[Params, bool], str] | None = None
    """Its name for people in figures, tables and pages ("QSGD 4-bit, bucket 512"); with
    ``brief``, parameters left at their default are left out ("QSGD 4-bit"). None: the
    label."""

    @property
    def sized_by_data(self) -> bool:
        """Its payload's size depends on the values it encodes (``wire`` is None for a codec):
        what a run sends changes with the gradients, so with training's progress."""
        return self.wire is None and not self.hook_only

    def wire_bytes(
        self, params: Params, numel: int, pieces: Sequence[int] | None = None
    ) -> int | None:
        """Bytes of the payload of ``numel`` values; ``pieces`` (the sizes of the tensors, or
        tensor parts, that make up the range) matter for per-tensor compressors, whose payload
        is one per-piece payload after the other, each with its own header."""
        if self.wire is None:
            return None
        wire = self.wire
        return sum(
            count * DTYPE_BYTES[dtype]
            for n in self.pieces(params, numel, pieces)
            for _, dtype, count in wire(params, n)
        )

    def pieces(self, params: Params, numel: int, pieces: Sequence[int] | None) -> tuple[int, ...]:
        """The sizes encoded separately: ``pieces`` for a per-tensor compressor, else the
        whole range as one."""
        if pieces is None or self.granularity(params) != "tensor":
            return (numel,)
        if sum(pieces) != numel or any(n < 0 for n in pieces):
            raise ValueError(f"{self.name}: pieces {list(pieces)} do not add up to {numel}")
        return tuple(pieces)


GRANULARITIES = {
    "value": "each value on its own (casts, a fixed fixed-point step): how the gradient is cut "
    "into ranges changes nothing",
    "bucket": "one scale per bucket of consecutive values; a bucket may span two tensors",
    "tensor": "one scale, width or budget per tensor: every tensor of a group (or its part in "
    "an owner range) is encoded separately, and the per-tensor payloads travel as one",
    "call": "one scale, width or budget per encode call, over whatever range the scheme hands "
    "it (a whole layer group, an owner range)",
}
"""What a compressor's granularity means (CompressorEntry.granularity)."""


def _named(name: str, *details: tuple[str, bool]) -> str:
    """``NAME, detail, ...`` keeping the details whose flag is true (display names)."""
    return ", ".join([name, *(text for text, keep in details if keep)])


def _match(pattern: str, text: str, params: Callable[[re.Match[str]], Params]) -> Params | None:
    m = re.fullmatch(pattern, text)
    return params(m) if m else None


def _scope(what: str) -> Param:
    """``scope``: the compressor's choice per tensor or per call (both are in the literature)."""
    return Param(
        "scope", "layer", f"layer: {what} per tensor (each tensor of a layer group on its own, "
        f"as the seeds do); global: one {what} for all an encode call gets (a group, an owner "
        "range)", str, choices=("layer", "global"),
    )  # fmt: skip


def _per(scope: str) -> str:
    return "tensor" if scope == "layer" else "call"


def _scope_name(scope: str) -> str:
    """``scope`` in a display name."""
    return "per layer" if scope == "layer" else "global"


_MX_NAMES = {"e4m3": "mxfp8-e4m3", "e5m2": "mxfp8-e5m2", "e3m2": "mxfp6-e3m2",
             "e2m3": "mxfp6-e2m3", "e2m1": "mxfp4"}  # fmt: skip


# -- entries ------------------------------------------------------------------------------------
def _cast(name: str, dtype: str, bits: float, summary: str, codec: str) -> CompressorEntry:
    return CompressorEntry(
        name, summary, "000 (16-bit baselines)" if bits == 16 else "", codec,
        label=lambda p: "fp32" if name == "none" else name,
        unlabel=lambda text: {} if text == ("fp32" if name == "none" else name) else None,
        display=lambda p, brief: "fp32" if name == "none" else name,
        nominal_bits=lambda p: bits,
        wire=lambda p, n: [("values", dtype, n)],
        summable=True,
        uncompressed=True,
        unbiased=lambda p: name == "none",
        integer_levels=lambda p: None if name == "none" else NOT_LEVELS,
        granularity=lambda p: "value",
    )  # fmt: skip


NONE = _cast(
    "none", "float32", 32.0, "no compression: fp32 values", "qbench.compress.none:NoCompression"
)
FP16 = _cast(
    "fp16", "float16", 16.0, "IEEE half precision, rounded to nearest", "qbench.compress.fp16:Half"
)
BF16 = _cast("bf16", "bfloat16", 16.0, "bfloat16, rounded to nearest",
             "qbench.compress.fp16:BFloat16")  # fmt: skip

QSGD_BITS = (1, 2, 3, 4, 5, 6, 7, 8, 16)
QSGD = CompressorEntry(
    "qsgd", "stochastic quantization per bucket, unbiased (Alistarh et al.)", "002 §2.3, §3.2.2",
    codec="qbench.compress.qsgd:QSGD",
    params=(
        Param("bits", 4, "bits per value on the wire: 1..8 (bit-packed) or 16", int,
              "1..8 or 16", choices=QSGD_BITS),
        Param("bucket_size", 512, "values sharing one scale; smaller buckets cut variance "
              "and cost 4 bytes each", int, "an integer >= 1", at_least(1)),
        Param("norm", "max", "bucket scale: max |x| (lower variance) or the l2 norm", str,
              "'max' or 'l2'", choices=("max", "l2")),
        Param("layout", "intervals", "levels: 2^bits - 1 equal intervals of [-s, s], or a "
              "sign bit and magnitude levels", str, "'intervals' or 'sign'",
              choices=("intervals", "sign")),
        Param("align", "contiguous", "contiguous: buckets of consecutive values, which may "
              "span two tensors; tensor: buckets restart at every tensor (the seed artefact's "
              "buckets live inside one matrix), so a tensor's last bucket may be partial",
              str, choices=("contiguous", "tensor")),
        Param("error_feedback", False, "add last step's quantization error first (the "
              "low-bit outer gradients of MuLoCo / SparseLoCo); off: unbiased", bool),
    ),
    label=lambda p: f"qsgd-{p['bits']}b-b{p['bucket_size']}"
    + ("-l2" if p["norm"] == "l2" else "") + ("-sign" if p["layout"] == "sign" else "")
    + ("-tensor" if p["align"] == "tensor" else "") + ("-ef" if p["error_feedback"] else ""),
    unlabel=lambda text: _match(
        r"qsgd-(\d+)b-b(\d+)(-l2)?(-sign)?(-tensor)?(-ef)?", text, lambda m: {
            "bits": int(m[1]), "bucket_size": int(m[2]), "norm": "l2" if m[3] else "max",
            "layout": "sign" if m[4] else "intervals",
            "align": "tensor" if m[5] else "contiguous", "error_feedback": bool(m[6])}),
    display=lambda p, brief: _named(
        f"QSGD {p['bits']}-bit",
        (f"bucket {p['bucket_size']}", not brief or p["bucket_size"] != 512),
        ("l2 norm", p["norm"] == "l2"), ("sign layout", p["layout"] == "sign"),
        ("buckets per tensor", p["align"] == "tensor"),
        ("error feedback", bool(p["error_feedback"]))),
    nominal_bits=lambda p: float(p["bits"]),
    wire=wire.qsgd_wire,
    granularity=lambda p: "tensor" if p["align"] == "tensor" else "bucket",
    unbiased=lambda p: not p["error_feedback"],
    error_feedback=lambda p: bool(p["error_feedback"]),
    integer_levels=lambda p: _qsgd_integer(p),
    integer_grid=lambda p: ((1 << (p["bits"] - 1)) - 1, p["bucket_size"]),
    cross_check=lambda p: (
        "layout 'sign' needs bits >= 2 (one bit is the sign), got bits=1; use `bits: 2` or "
        "`layout: intervals`" if p["layout"] == "sign" and p["bits"] == 1 else None
    ),
)  # fmt: skip


def _qsgd_integer(p: Params) -> str | None:
    if p["bits"] < 2:
        return (
            "it needs qsgd bits >= 2 (levels -L..L, L = 2^(bits-1) - 1), got bits 1; e.g. `bits: 2`"
        )
    if p["norm"] != "max":
        return (
            f"it scales buckets by the max |x| over ranks, got qsgd norm {p['norm']}; "
            "use `norm: max`"
        )
    if p["align"] != "contiguous":
        return (
            "its ranks share one grid of contiguous buckets over the slice, got qsgd align "
            f"{p['align']}; use `align: contiguous`"
        )
    return None


ONEBIT = CompressorEntry(
    "onebit", "1bitSGD: a sign per value and two means per bucket, error feedback (Seide et al.)",
    "002 §2.2, §3.2.2", codec="qbench.compress.onebit:OneBit",
    params=(
        Param("bucket_size", 64, "values sharing one (avg+, avg-) pair", int, "an integer >= 1",
              at_least(1)),
        Param("error_feedback", True, "add last step's quantization error first", bool),
        Param("columns", False, "CNTK's per-column buckets (seed 002 §3.2.2): one bucket per "
              "column of each layer", bool),
    ),
    label=lambda p: "1bit-" + ("col" if p["columns"] else f"b{p['bucket_size']}")
    + ("" if p["error_feedback"] else "-noef"),
    unlabel=lambda text: _match(r"1bit-(?:b(\d+)|(col))(-noef)?", text, lambda m: {
        "bucket_size": int(m[1]) if m[1] else 64, "error_feedback": not m[3],
        "columns": bool(m[2])}),
    display=lambda p, brief: _named(
        "1-bit SGD", ("per column", p["columns"]),
        (f"bucket {p['bucket_size']}", not p["columns"] and (not brief or p["bucket_size"] != 64)),
        ("no error feedback", not p["error_feedback"])),
    nominal_bits=lambda p: 1.0,
    wire=wire.onebit_wire,
    error_feedback=lambda p: bool(p["error_feedback"]),
    stateful=True,
    # columns: one bucket per column; the plan groups tensors by column length, so a column
    # never spans two tensors
    granularity=lambda p: "bucket",
)  # fmt: skip


def _fixed_granularity(p: Params) -> str:
    return _per(p["scope"]) if p["delta"] == "auto" else "value"


FIXEDPOINT = CompressorEntry(
    "fixedpoint", "stochastic rounding onto a fixed-point grid of step delta", "000 §3",
    codec="qbench.compress.fixedpoint:FixedPoint",
    params=(
        Param("bits", 8, "code width, 2..16", int, "an integer 2..16", between(2, 16)),
        Param("delta", "auto", "grid step; auto: the smallest power of two that fits max |x| "
              "(sent as its exponent)", (float, str), "a number > 0 or 'auto'",
              lambda v: v == "auto" or (not isinstance(v, str) and positive_finite(v))),
        _scope("auto delta"),
    ),
    label=lambda p: f"fixed-{p['bits']}b" + ("" if p["delta"] == "auto" else f"-d{p['delta']:g}")
    + ("-layer" if _fixed_granularity(p) == "tensor" else ""),
    unlabel=lambda text: _match(r"fixed-(\d+)b(?:-d(.+?))?(-layer)?", text, lambda m: {
        "bits": int(m[1]), "delta": float(m[2]) if m[2] else "auto",
        # a fixed delta has no scope (every value on its own): the default reads back
        "scope": "layer" if m[3] or m[2] else "global"}),
    display=lambda p, brief: _named(
        f"fixed point {p['bits']}-bit",
        (f"step {p['delta']:g}" if p["delta"] != "auto" else "", p["delta"] != "auto"),
        (_scope_name(p["scope"]), p["delta"] == "auto" and (not brief or p["scope"] != "layer"))),
    nominal_bits=lambda p: float(p["bits"]),
    wire=wire.fixed_wire,
    unbiased=lambda p: True,  # within the representable range; values beyond it are clipped
    granularity=lambda p: _fixed_granularity(p),
    cross_check=lambda p: (
        f"scope says where the auto delta is chosen; with delta {p['delta']:g} every value is "
        "rounded on its own, so remove `scope` (or use `delta: auto`)"
        if p["delta"] != "auto" and p["scope"] != "layer" else None
    ),
)  # fmt: skip

TOPK = CompressorEntry(
    "topk", "the k largest |values| with their indices, error feedback", "001, 003",
    codec="qbench.compress.topk:TopK",
    params=(
        Param("ratio", 0.01, "fraction of the values sent; seed 001 keeps 1%", float,
              "in (0, 1]", fraction),
        Param("error_feedback", True, "add the values left out at the last step", bool),
        _scope("top-k budget"),
    ),
    label=lambda p: f"topk-{p['ratio'] * 100:g}%" + ("-layer" if p["scope"] == "layer" else "")
    + ("" if p["error_feedback"] else "-noef"),
    unlabel=lambda text: _match(r"topk-(.+?)%(-layer)?(-noef)?", text, lambda m: {
        "ratio": float(m[1]) / 100, "error_feedback": not m[3],
        "scope": "layer" if m[2] else "global"}),
    display=lambda p, brief: _named(
        f"top-k {p['ratio'] * 100:g} %",
        (_scope_name(p["scope"]), not brief or p["scope"] != "layer"),
        ("no error feedback", not p["error_feedback"])),
    nominal_bits=lambda p: 64.0 * p["ratio"],
    wire=wire.topk_wire,
    error_feedback=lambda p: bool(p["error_feedback"]),
    stateful=True,
    granularity=lambda p: _per(p["scope"]),
)  # fmt: skip

ADAPTIVE = CompressorEntry(
    "adaptive", "entropy-adaptive bit width per call, canonical Huffman coding", "004 Alg. 1-2",
    codec="qbench.compress.adaptive:Adaptive",
    params=(
        Param("sample_fraction", 0.03, "F: fraction sampled to estimate the entropy", float,
              "in (0, 1]", fraction),
        Param("probe_bits", 4, "M: bits of the probe quantizer", int, "an integer in 1..15",
              between(1, 15)),
        Param("floor_bits", 6, "c: floor on the width; widths range over [c, c + M]", int,
              "an integer in 2..15", between(2, 15)),
        _scope("bit width and scale"),
        Param("entropy_grid", "minmax", "the M-bit probe's 2^M bins: minmax, over [min, max] of "
              "the tensor (Algorithm 1 lines 3-4); symmetric, over [-max |x|, max |x|], which "
              "puts a bin edge at zero and adds up to a bit of entropy on peaked gradients", str,
              choices=("minmax", "symmetric")),
    ),
    label=lambda p: (
        f"adaptive-c{p['floor_bits']}-m{p['probe_bits']}-f{p['sample_fraction'] * 100:g}%"
        + ("-layer" if p["scope"] == "layer" else "")
        + ("-minmax" if p["entropy_grid"] == "minmax" else "")
    ),
    unlabel=lambda text: _match(
        r"adaptive-c(\d+)-m(\d+)-f(.+?)%(-layer)?(-minmax)?", text, lambda m: {
            "sample_fraction": float(m[3]) / 100, "probe_bits": int(m[2]),
            "floor_bits": int(m[1]), "scope": "layer" if m[4] else "global",
            "entropy_grid": "minmax" if m[5] else "symmetric"}),
    display=lambda p, brief: _named(
        f"entropy-adaptive {p['floor_bits']}-{p['floor_bits'] + p['probe_bits']} bit",
        (f"{p['sample_fraction'] * 100:g} % sampled",
         not brief or p["sample_fraction"] != 0.03),
        (_scope_name(p["scope"]), not brief or p["scope"] != "layer"),
        ("symmetric grid", p["entropy_grid"] == "symmetric")),
    nominal_bits=lambda p: p["floor_bits"] + p["probe_bits"] / 2,
    unbiased=lambda p: True,
    granularity=lambda p: _per(p["scope"]),
    cross_check=lambda p: (
        f"floor_bits + probe_bits is the widest code and must be <= 16, got {p['floor_bits']} "
        f"+ {p['probe_bits']}; e.g. `floor_bits: 6` `probe_bits: 4`"
        if p["floor_bits"] + p["probe_bits"] > 16 else None
    ),
)  # fmt: skip


# -- low-precision float wire formats (beyond the seeds: what hardware ships now) ------------
def _rounding() -> Param:
    return Param(
        "rounding", "nearest", "nearest: round to nearest, ties to even (the specifications' "
        "conversion); stochastic: up or down with probability by closeness (unbiased between "
        "the neighbours; values beyond the largest still saturate)", str,
        choices=("nearest", "stochastic"),
    )  # fmt: skip


def _ef_param() -> Param:
    return Param("error_feedback", False, "add last step's rounding error first", bool)


def _float_suffix(p: Params) -> str:
    return ("-sr" if p["rounding"] == "stochastic" else "") + ("-ef" if p["error_feedback"] else "")


def _float_details(p: Params) -> tuple[tuple[str, bool], ...]:
    return (("stochastic rounding", p["rounding"] == "stochastic"),
            ("error feedback", bool(p["error_feedback"])))  # fmt: skip


def _float_unlabel(m: re.Match[str], first: int) -> Params:
    return {
        "rounding": "stochastic" if m[first] else "nearest",
        "error_feedback": bool(m[first + 1]),
    }


def _float_integer(element: str) -> str | None:
    if integer_units(element) is None:
        return (
            f"{element} values span 2^-16 .. 57344, more than an int32 sum holds; "
            "use e4m3 (or reduce-broadcast)"
        )
    return None


FP8 = CompressorEntry(
    "fp8", "FP8 (OCP E4M3 or E5M2) with an fp32 scale per tensor or per block", "",
    codec="qbench.compress.lowfloat:FP8",
    params=(
        Param("format", "e4m3", "e4m3: more precision, up to 448; e5m2: more range, up to "
              "57344 (IEEE-like, with inf)", str, choices=("e4m3", "e5m2")),
        Param("block_size", 0, "values sharing one fp32 scale (max |x| / the largest value); "
              "0: one scale per tensor", int, "an integer >= 0", at_least(0), example=128),
        _rounding(),
        _ef_param(),
    ),
    label=lambda p: f"fp8-{p['format']}" + (f"-b{p['block_size']}" if p["block_size"] else "")
    + _float_suffix(p),
    unlabel=lambda text: _match(r"fp8-(e4m3|e5m2)(?:-b(\d+))?(-sr)?(-ef)?", text, lambda m: {
        "format": m[1], "block_size": int(m[2]) if m[2] else 0, **_float_unlabel(m, 3)}),
    display=lambda p, brief: _named(
        f"FP8 {p['format'].upper()}",
        (f"block {p['block_size']}" if p["block_size"] else "per tensor", not brief or
         bool(p["block_size"])), *_float_details(p)),
    nominal_bits=lambda p: 8.0,
    wire=wire.fp8_wire,
    error_feedback=lambda p: bool(p["error_feedback"]),
    # the scale maps max |x| onto the largest value, so nothing saturates (but for the fp32
    # rounding of that division, which can push the top value one step over: clamped)
    unbiased=lambda p: p["rounding"] == "stochastic",
    integer_levels=lambda p: _float_integer(p["format"]) or (
        None if p["block_size"] else "its ranks share a scale per block, and fp8 block_size 0 "
        "keeps one per tensor; set `block_size` (e.g. 128)"),
    integer_grid=lambda p: (integer_units(p["format"]) or 0, p["block_size"]),
    granularity=lambda p: "bucket" if p["block_size"] else "tensor",
)  # fmt: skip

MX = CompressorEntry(
    "mx", "OCP Microscaling (MXFP8 / MXFP6 / MXFP4): 32 values share an E8M0 power-of-two "
    "scale", "", codec="qbench.compress.lowfloat:MX",
    params=(
        Param("element", "e2m1", "element format: e4m3 or e5m2 (MXFP8), e3m2 or e2m3 (MXFP6), "
              "e2m1 (MXFP4)", str, choices=tuple(_MX_NAMES)),
        _rounding(),
        _ef_param(),
    ),
    label=lambda p: _MX_NAMES[p["element"]] + _float_suffix(p),
    unlabel=lambda text: _match(
        r"(mxfp8-e4m3|mxfp8-e5m2|mxfp6-e3m2|mxfp6-e2m3|mxfp4)(-sr)?(-ef)?", text, lambda m: {
            "element": {v: k for k, v in _MX_NAMES.items()}[m[1]], **_float_unlabel(m, 2)}),
    display=lambda p, brief: _named(
        _MX_NAMES[p["element"]].upper().replace("-E", " E"), *_float_details(p)),
    nominal_bits=lambda p: float(ELEMENTS[p["element"]][0]),
    wire=wire.mx_wire,
    error_feedback=lambda p: bool(p["error_feedback"]),
    # the specification's scale leaves max |x| / X in [2^emax, 2^(emax+1)), above the largest
    # element value: a block's largest values saturate, so no rounding mode is unbiased
    unbiased=lambda p: False,
    integer_levels=lambda p: _float_integer(p["element"]),
    integer_grid=lambda p: (integer_units(p["element"]) or 0, MX_BLOCK),
    granularity=lambda p: "bucket",
)  # fmt: skip

NVFP4 = CompressorEntry(
    "nvfp4", "NVFP4: E2M1 values, an E4M3 scale per 16 values and an fp32 scale per tensor", "",
    codec="qbench.compress.lowfloat:NVFP4",
    params=(_rounding(), _ef_param(), _scope("fp32 tensor scale")),
    label=lambda p: "nvfp4" + ("-global" if p["scope"] == "global" else "") + _float_suffix(p),
    unlabel=lambda text: _match(r"nvfp4(-global)?(-sr)?(-ef)?", text, lambda m: {
        "scope": "global" if m[1] else "layer", **_float_unlabel(m, 2)}),
    display=lambda p, brief: _named(
        "NVFP4", ("global tensor scale", p["scope"] == "global"), *_float_details(p)),
    nominal_bits=lambda p: 4.0,
    wire=wire.nvfp4_wire,
    error_feedback=lambda p: bool(p["error_feedback"]),
    unbiased=lambda p: False,  # the block scale is rounded to E4M3: a block's top may saturate
    integer_levels=lambda p: None if p["scope"] == "global" else (
        "its ranks share one tensor scale over the slice they sum, and nvfp4 scope layer keeps "
        "one per tensor; use `scope: global`"),
    integer_grid=lambda p: (integer_units("e2m1") or 0, NVFP4_BLOCK),
    granularity=lambda p: _per(p["scope"]),
)  # fmt: skip

POWERSGD = CompressorEntry(
    "powersgd", "PowerSGD low-rank approximation, torch's DDP hook (Vogels et al.)", "",
    codec="qbench.compress.powersgd:PowerSGD",
    params=(
        Param("rank", 1, "rank r of the approximation (torch's matrix_approximation_rank)", int,
              "an integer >= 1", at_least(1), example=2),
        Param("start_iter", 2, "iterations allreduced uncompressed first (torch: 1000)", int,
              "an integer >= 0", at_least(0)),
        Param("warm_start", True, "reuse last step's Q", bool),
        Param("error_feedback", True, "add the last step's compression error", bool),
        Param("min_compression_rate", 2.0, "compress a matrix only when it shrinks this much",
              float, "a number >= 1", at_least(1)),
    ),
    label=lambda p: f"powersgd-r{p['rank']}" + ("" if p["warm_start"] else "-cold")
    + ("" if p["error_feedback"] else "-noef"),
    unlabel=lambda text: _match(r"powersgd-r(\d+)(-cold)?(-noef)?", text, lambda m: {
        "rank": int(m[1]), "warm_start": not m[2], "error_feedback": not m[3]}),
    display=lambda p, brief: _named(
        f"PowerSGD rank {p['rank']}", ("cold start", not p["warm_start"]),
        ("no error feedback", not p["error_feedback"])),
    nominal_bits=lambda p: None,
    error_feedback=lambda p: bool(p["error_feedback"]),
    hook_only=True,
    stateful=True,
    granularity=lambda p: "tensor",  # torch's hook factorises each matrix of a bucket
    cross_check=lambda p: (
        f"start_iter must be an integer >= 2 (torch needs two plain iterations before warm "
        f"start or error feedback), got {p['start_iter']}; e.g. `start_iter: 2`"
        if (p["warm_start"] or p["error_feedback"]) and p["start_iter"] < 2 else None
    ),
)  # fmt: skip

COMPRESSORS: Registry[CompressorEntry] = Registry({
    e.name: e for e in (NONE, QSGD, ONEBIT, FP16, BF16, FIXEDPOINT, TOPK, ADAPTIVE, FP8, MX, NVFP4,
                        POWERSGD)
})  # fmt: skip
"""Every compressor by name; plug-ins (``qbench.catalog.plugins``) join on first read."""
