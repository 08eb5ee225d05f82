"""Names for people (qbench.report.names, from the catalog entries' ``display``): every label a
results directory stores reads as words, and scheme labels turn back into their parameters."""

from __future__ import annotations

import pytest

from qbench import catalog
from qbench.errors import UserError
from qbench.report import names

COMPRESSORS = {  # label -> (full name, brief name)
    "fp32": ("fp32", "fp32"),
    "bf16": ("bf16", "bf16"),
    "qsgd-4b-b512": ("QSGD 4-bit, bucket 512", "QSGD 4-bit"),
    "qsgd-2b-b128-l2": ("QSGD 2-bit, bucket 128, l2 norm", "QSGD 2-bit, bucket 128, l2 norm"),
    "1bit-b64": ("1-bit SGD, bucket 64", "1-bit SGD"),
    "1bit-col-noef": ("1-bit SGD, per column, no error feedback",) * 2,
    "fixed-8b": ("fixed point 8-bit", "fixed point 8-bit"),
    "fixed-6b-d0.01": ("fixed point 6-bit, step 0.01",) * 2,
    "topk-1%": ("top-k 1 %", "top-k 1 %"),
    "adaptive-c6-m4-f3%": ("entropy-adaptive 6-10 bit, 3 % sampled", "entropy-adaptive 6-10 bit"),
    "powersgd-r2": ("PowerSGD rank 2", "PowerSGD rank 2"),
}
SCHEMES = {  # label -> name, as run.json stores labels (catalog.scheme_label)
    "allreduce": "allreduce",
    "reduce-broadcast+overlap4": "reduce-broadcast, 4 chunks pipelined",
    "reduce-broadcast+backward": "reduce-broadcast per DDP bucket",
    "gossip+algorithmchoco+topologyring": "Choco-SGD, ring",
    "gossip+algorithmdpsgd+topologytorus": "D-PSGD, torus",
    "push-sum+qgmTrue+topologyexponential": "push-sum + QGM, exponential graph",
    "push-sum+topologydirected-ring": "push-sum, directed ring",
    "parameter-server+downqsgd-8b-b512": "parameter server, QSGD 8-bit down",
    "async-ps+staleness6": "async PS, staleness 6",
    "async-ps+downqsgd-8b-b512+ratio0.1+staleness6+variantsparse":
        "Sparse-AsyLPG, staleness 6, 10 % kept, QSGD 8-bit down",
    "ddp": "DDP",
    "ddp+bucket_cap_mb5.0": "DDP, buckets 5 MB",
    "simulated-lowprec": "simulated low precision",
}  # fmt: skip
METHODS = [  # (scheme label, compressor label, name)
    ("ddp", "fp32", "DDP fp32"),
    ("ddp", "powersgd-r2", "DDP PowerSGD rank 2"),
    ("reduce-broadcast+backward", "qsgd-4b-b512", "QSGD 4-bit per DDP bucket"),
    ("allgather+backward", "qsgd-4b-b512", "QSGD 4-bit per DDP bucket (allgather)"),
    ("gossip+algorithmchoco+topologyring", "qsgd-4b-b512", "Choco-SGD, ring · QSGD 4-bit"),
    ("allreduce", "fp32", "allreduce · fp32"),
    ("allreduce", "qsgd-4b-b512 (simulated)", "allreduce · QSGD 4-bit (simulated)"),
]


@pytest.mark.parametrize("label", COMPRESSORS)
def test_compressor_names(label: str) -> None:
    full, brief = COMPRESSORS[label]
    assert names.compressor(label) == full
    assert names.compressor(label, brief=True) == brief


@pytest.mark.parametrize("label", SCHEMES)
def test_scheme_names_and_labels_round_trip(label: str) -> None:
    assert names.scheme(label) == SCHEMES[label]
    spec = catalog.scheme_from_label(label)
    given = {k: v for k, v in spec.given.items() if k != "name"}
    assert catalog.scheme_label(spec.name, given) == label


@pytest.mark.parametrize(("scheme", "compressor", "name"), METHODS)
def test_method_names(scheme: str, compressor: str, name: str) -> None:
    assert names.method(scheme, compressor) == name


def test_unknown_labels_are_shown_as_they_are() -> None:
    """A plug-in's label, or one from a newer qbench, must not break a report."""
    assert names.compressor("mycodec-3") == "mycodec-3"
    assert names.scheme("ring-allreduce+foo1") == "ring-allreduce+foo1"
    assert names.method("ring-allreduce", "mycodec-3") == "ring-allreduce · mycodec-3"
    with pytest.raises(UserError, match="no scheme has the label"):
        catalog.scheme_from_label("gossip+colour3")


BUILT_IN = (
    ("none", "qsgd", "onebit", "fp16", "bf16", "fixedpoint", "topk", "adaptive", "powersgd"),
    ("allreduce", "reduce-broadcast", "gossip", "allgather", "simulated-lowprec",
     "integer-allreduce", "parameter-server", "push-sum", "async-ps", "ddp"),
)  # fmt: skip


def test_every_built_in_entry_has_a_display_name() -> None:
    for name in BUILT_IN[0]:
        assert catalog.COMPRESSORS[name].display is not None, name
    for name in BUILT_IN[1]:
        assert catalog.SCHEMES[name].display is not None, name
