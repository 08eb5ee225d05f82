"""What a projection projects (``qbench project CLUSTER STUDY``): workloads described by their
size (parameters, gradient tensors) and batch, the methods (compressors of the catalog, each
sent by the cluster's collective) and the GPU counts.

    name: seed002-figure10
    gpus: [1, 2, 4, 8, 16]
    workloads:
      - {name: AlexNet, params: 62000000, tensors: 16, batch: {1: 256, 2: 256, 4: 256}}
      - {name: gpt-1.3b, params: 1.3e9, tensors: 292, batch_per_gpu: 8, flops_per_sample: ...}
    methods: [none, bf16, {name: qsgd, bits: 4, bucket_size: 512}]

``coded_tensors`` and ``coded_share`` (optional) say which tensors a compressor codes, the rest
travelling in fp32, as seed 002's implementation sends its small matrices.
``batch`` is the global batch at each GPU count (seed 002's Figure 4); ``batch_per_gpu`` keeps
each GPU's share fixed. ``flops_per_sample`` (training FLOPs, forward and backward) is used when
the device states ``flops_per_s`` and has no measured compute for the workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbench import catalog
from qbench.cluster import units
from qbench.errors import UserError, choice_error

_TOP = ("name", "gpus", "workloads", "methods")
_WORKLOAD = ("name", "params", "tensors", "batch", "batch_per_gpu", "flops_per_sample",
             "coded_tensors", "coded_share")  # fmt: skip


@dataclass(frozen=True)
class Workload:
    name: str
    params: int
    tensors: int
    batch: Mapping[int, int]
    """Global batch per GPU count; empty when ``per_gpu`` is set."""
    per_gpu: int = 0
    flops_per_sample: float = 0.0
    coded_tensors: int = 0
    """Tensors a compressor codes (0: all). Seed 002 sends small matrices in full precision,
    coding the largest ones that hold more than 99 % of the parameters (§3.2.2)."""
    coded_share: float = 1.0
    """The share of the parameters in those tensors."""

    @property
    def coded_params(self) -> int:
        return round(self.params * self.coded_share)

    def global_batch(self, gpus: int) -> int:
        if self.per_gpu:
            return self.per_gpu * gpus
        if gpus not in self.batch:
            raise UserError(f"workload {self.name}: no batch for {gpus} GPUs; add `{gpus}: N` "
                            "to its batch, or give batch_per_gpu")  # fmt: skip
        return self.batch[gpus]


@dataclass(frozen=True)
class Study:
    name: str
    gpus: tuple[int, ...]
    workloads: tuple[Workload, ...]
    methods: tuple[catalog.CompressorSpec, ...]
    source: str = ""


def load(path: str | Path) -> Study:
    p = Path(path)
    doc = units.read_yaml(p, "study file", "scenarios/projection/studies/seed002-figure10.yaml")
    return parse(doc, str(p))


def parse(doc: Any, source: str = "<study>") -> Study:
    example = "`{name: s, gpus: [1, 8], workloads: [...], methods: [...]}`"
    doc = units.mapping(doc, "study file", example)
    unknown = sorted(set(doc) - set(_TOP))
    if unknown:
        raise choice_error("study key", unknown[0], list(_TOP))
    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise UserError(f"gpus must be a list of GPU counts, got {gpus!r}; e.g. `gpus: [1, 8, 16]`")
    counts = tuple(sorted({units.count(g, "gpus") for g in gpus}))
    works = doc.get("workloads")
    if not isinstance(works, list) or not works:
        raise UserError("workloads must be a list; e.g. `workloads: [{name: AlexNet, params: "
                        "62000000, tensors: 16, batch_per_gpu: 32}]`")  # fmt: skip
    methods = doc.get("methods")
    if not isinstance(methods, list) or not methods:
        raise UserError("methods must be a list of compressors; e.g. `methods: [none, bf16, "
                        "{name: qsgd, bits: 4}]`")  # fmt: skip
    # Parse site: the study file's methods (tests/test_catalog_parse_sites.py).
    specs = tuple(catalog.compressor(m) for m in methods)
    return Study(name=str(doc.get("name") or Path(source).stem), gpus=counts,
                 workloads=tuple(_workload(w, i) for i, w in enumerate(works)),
                 methods=specs, source=source)  # fmt: skip


def _workload(value: Any, i: int) -> Workload:
    key = f"workloads[{i}]"
    example = "`{name: AlexNet, params: 62000000, tensors: 16, batch_per_gpu: 32}`"
    w = units.mapping(value, key, example)
    unknown = sorted(set(w) - set(_WORKLOAD))
    if unknown:
        raise choice_error(f"{key} key", unknown[0], list(_WORKLOAD))
    if not w.get("name"):
        raise UserError(f"{key}.name is missing; e.g. `name: AlexNet`")
    key = f"workload {w['name']}"
    params = int(units.positive(w.get("params"), f"{key}: params", "params: 62000000"))
    tensors = units.count(w.get("tensors"), f"{key}: tensors")
    if ("batch" in w) == ("batch_per_gpu" in w):
        raise UserError(f"{key}: give one of batch (global, per GPU count: `{{1: 256, 8: 256}}`) "
                        "or batch_per_gpu")  # fmt: skip
    batch = {}
    if "batch" in w:
        given = units.mapping(w["batch"], f"{key}: batch", "`{1: 256, 2: 256, 4: 256}`")
        batch = {units.count(k, f"{key}: batch GPU count"): units.count(v, f"{key}: batch")
                 for k, v in given.items()}  # fmt: skip
    per_gpu = 0
    if "batch_per_gpu" in w:
        per_gpu = units.count(w["batch_per_gpu"], f"{key}: batch_per_gpu")
    flops = w.get("flops_per_sample")
    coded = units.count(w.get("coded_tensors", tensors), f"{key}: coded_tensors")
    share = units.positive(w.get("coded_share", 1.0), f"{key}: coded_share", "coded_share: 0.99")
    if coded > tensors or share > 1:
        raise UserError(
            f"{key}: coded_tensors ({coded}) and coded_share ({share:g}) must not exceed the "
            f"workload's {tensors} tensors and all of its parameters"
        )
    return Workload(name=str(w["name"]), params=params, tensors=tensors, batch=batch,
                    per_gpu=per_gpu, coded_tensors=coded, coded_share=share,
                    flops_per_sample=units.positive(flops, f"{key}: flops_per_sample", "6e9")
                    if flops is not None else 0.0)  # fmt: skip
