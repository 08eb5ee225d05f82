"""Names for people (qbench.report.names, from the catalog entries' ``display``): every label a
results directory stores reads as words, from the spec its run recorded (``names.learn``, which
``stats.load`` calls), never from the label itself; and scheme labels turn back into their
parameters (the fallback of records without a spec)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from qbench import catalog
from qbench.errors import UserError
from qbench.records.schema import RunRecord
from qbench.records.store import ResultStore
from qbench.records.view import RunSpecs
from qbench.report import names, stats
from qbench.spec.network import Link

VOCABULARY = names.Vocabulary()
"""What the test running now learned, as ``stats.load`` learns a results directory's."""


@pytest.fixture(autouse=True)
def _nothing_learned() -> Iterator[None]:
    """Each test starts from what it learns itself, named by that alone."""
    global VOCABULARY
    VOCABULARY = names.Vocabulary()
    with names.using(VOCABULARY):
        yield


def _learn(scheme: str = "allreduce", compressor: str = "fp32") -> None:
    """What ``stats.load`` does for a run without a spec: its labels, read back by the catalog
    (``records.view``'s fallback), stand for its specs."""
    specs = RunSpecs(catalog.from_label(compressor), catalog.scheme_from_label(scheme), Link())
    VOCABULARY.learn({"scheme": scheme, "compressor": compressor}, specs)


COMPRESSORS = {  # label -> (full name, brief name)
    "fp32": ("fp32", "fp32"),
    "bf16": ("bf16", "bf16"),
    "qsgd-4b-b512": ("QSGD 4-bit, bucket 512", "QSGD 4-bit"),
    "qsgd-2b-b128-l2": ("QSGD 2-bit, bucket 128, l2 norm", "QSGD 2-bit, bucket 128, l2 norm"),
    "1bit-b64": ("1-bit SGD, bucket 64", "1-bit SGD"),
    "1bit-col-noef": ("1-bit SGD, per column, no error feedback",) * 2,
    "qsgd-4b-b512-tensor": (
        "QSGD 4-bit, bucket 512, buckets per tensor",
        "QSGD 4-bit, buckets per tensor",
    ),
    # scope: layer is the default; labels from before it read back as global (what ran)
    "fixed-8b-layer": ("fixed point 8-bit, per layer", "fixed point 8-bit"),
    "fixed-8b": ("fixed point 8-bit, global",) * 2,
    "fixed-6b-d0.01": ("fixed point 6-bit, step 0.01",) * 2,
    "topk-1%-layer": ("top-k 1 %, per layer", "top-k 1 %"),
    "topk-1%": ("top-k 1 %, global",) * 2,
    "adaptive-c6-m4-f3%-layer-minmax": (
        "entropy-adaptive 6-10 bit, 3 % sampled, per layer",
        "entropy-adaptive 6-10 bit",
    ),
    "adaptive-c6-m4-f3%": (
        "entropy-adaptive 6-10 bit, 3 % sampled, global, symmetric grid",
        "entropy-adaptive 6-10 bit, global, symmetric grid",
    ),
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
    "fsdp": "FSDP",
    "fsdp+prefetch2+reshard_after_forwardFalse": "FSDP, kept after forward (ZeRO-2), prefetch 2",
}  # fmt: skip
METHODS = [  # (scheme label, compressor label, name)
    ("ddp", "fp32", "DDP fp32"),
    ("ddp", "powersgd-r2", "DDP PowerSGD rank 2"),
    ("ddp+bucket_cap_mb5.0", "bf16", "DDP bf16, buckets 5 MB"),
    ("fsdp", "bf16", "FSDP bf16"),
    (
        "fsdp+all_gatherqsgd-8b-b256+param_dtypebf16",
        "qsgd-4b-b512",
        "FSDP QSGD 4-bit, bf16 parameters, all-gather QSGD 8-bit, bucket 256",
    ),
    ("reduce-broadcast+backward", "qsgd-4b-b512", "QSGD 4-bit per DDP bucket"),
    ("allgather+backward", "qsgd-4b-b512", "QSGD 4-bit per DDP bucket (allgather)"),
    ("gossip+algorithmchoco+topologyring", "qsgd-4b-b512", "Choco-SGD, ring · QSGD 4-bit"),
    ("allreduce", "fp32", "allreduce · fp32"),
    ("allreduce", "qsgd-4b-b512 (simulated)", "allreduce · QSGD 4-bit (simulated)"),
]


@pytest.mark.parametrize("label", COMPRESSORS)
def test_compressor_names(label: str) -> None:
    _learn(compressor=label)
    full, brief = COMPRESSORS[label]
    assert names.compressor(label) == full
    assert names.compressor(label, brief=True) == brief


@pytest.mark.parametrize("label", SCHEMES)
def test_scheme_names_and_labels_round_trip(label: str) -> None:
    _learn(scheme=label)
    assert names.scheme(label) == SCHEMES[label]
    spec = catalog.scheme_from_label(label)
    given = {k: v for k, v in spec.given.items() if k != "name"}
    assert catalog.scheme_label(spec.name, given) == label


@pytest.mark.parametrize(("scheme", "compressor", "name"), METHODS)
def test_method_names(scheme: str, compressor: str, name: str) -> None:
    _learn(scheme, compressor.removesuffix(" (simulated)"))
    assert names.method(scheme, compressor) == name


def test_unknown_labels_are_shown_as_they_are() -> None:
    """A plug-in's label, or one from a newer qbench, must not break a report; nor is a label
    no loaded run recorded parsed back, even one the catalog could read."""
    assert names.compressor("qsgd-4b-b512") == "qsgd-4b-b512"
    assert names.method("ddp", "fp32") == "ddp · fp32"
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


def test_names_come_from_the_recorded_spec_not_the_label() -> None:
    """A label that says 4 bits, learned with a 2-bit spec, is named by the spec."""
    two = catalog.compressor({"name": "qsgd", "bits": 2, "bucket_size": 128})
    ring = catalog.scheme({"name": "gossip", "algorithm": "choco", "topology": "ring"})
    VOCABULARY.learn({"compressor": "qsgd-4b-b512", "scheme": "allreduce", "network": "1gbit"},
                RunSpecs(two, ring, Link(1e8, "100mbit")))  # fmt: skip
    assert names.compressor("qsgd-4b-b512") == "QSGD 2-bit, bucket 128"
    assert names.scheme("allreduce") == "Choco-SGD, ring"
    assert names.link("1gbit") == Link(1e8, "100mbit")


def _record(run_id: str, compressor: dict, labels: dict) -> RunRecord:
    spec = {"compressor": compressor, "scheme": "ddp", "network": {"bandwidth": "1gbit"}}
    return RunRecord(run_id=run_id, status="failed", labels=labels, spec=spec)  # no parquet


def test_loading_a_results_directory_learns_its_runs_specs(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    labels = {"compressor": "qsgd-8b-b256", "scheme": "ddp", "network": "1gbit"}
    store.write_record(_record("q", {"name": "qsgd", "bits": 8, "bucket_size": 256}, labels))
    plugin = {"compressor": "mycodec-3", "scheme": "ddp", "network": "1gbit"}
    store.write_record(_record("p", {"name": "mycodec", "level": 3}, plugin))  # not installed
    results = stats.load(tmp_path)
    runs = results.runs.set_index("run_id")
    with names.using(results.names):
        assert names.method("ddp", "qsgd-8b-b256") == "DDP QSGD 8-bit, bucket 256"  # not 512
        assert names.link("1gbit") == Link(1e9, "1gbit")
        assert names.compressor("mycodec-3") == "mycodec-3"
    assert runs.loc["p", "status"] == "failed"  # read all the same, not "unreadable"


def test_runs_are_named_by_the_vocabulary_in_scope_only() -> None:
    """No module state (issue 45 item 5): what one load learned names nothing outside its own
    block, so a second report in the same process names its runs as it would alone."""
    two = catalog.compressor({"name": "qsgd", "bits": 2, "bucket_size": 128})
    mine = names.Vocabulary()
    mine.learn({"compressor": "qsgd-4b-b512"}, RunSpecs(two, catalog.scheme("allreduce"), Link()))
    with names.using(mine):
        assert names.compressor("qsgd-4b-b512") == "QSGD 2-bit, bucket 128"
        with names.using(names.Vocabulary()):  # another results directory's
            assert names.compressor("qsgd-4b-b512") == "qsgd-4b-b512"
    assert names.compressor("qsgd-4b-b512") == "qsgd-4b-b512"  # this test's own: learned none
    both = mine.merged(names.Vocabulary())
    with names.using(both):
        assert names.compressor("qsgd-4b-b512") == "QSGD 2-bit, bucket 128"
