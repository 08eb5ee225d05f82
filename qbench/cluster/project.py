"""The projection: each method's iteration on a declared cluster, from the declared facts.

    iteration = compute + codec + exchange       (seed 002's MPI path exchanges after backward;
                                                  ``double_buffering``: the longer of codec and
                                                  exchange, both after compute)

* **compute**: the device's compute for the workload at the per-GPU batch (the global batch
  over K), linear in the batch from the declared measurement, or ``flops_per_sample * batch /
  (flops_per_s * efficiency)``;
* **exchange** (:mod:`qbench.cluster.collectives`): of the method's payload, its wire bytes
  from the catalog (``CompressorSpec.wire_bytes``: codes and scales; fp32 for ``none``);
* **codec**: none for fp32. A summable cast (fp16, bf16) is allreduced, so codes all n values
  once each way; any other compressor codes the workload's coded tensors (the rest travel in
  fp32) through reduce-and-broadcast, whose codec units come from the scheme's declared traffic
  (``qbench.costmodel.formulas.codec_units``: n (1 + 1/K) encoded, 2 n decoded). At stated
  rates, ``units / rate`` plus ``launch`` per kernel: one per coded tensor for each encode (its
  own and the owner's), and one per received range for each decode, 2 (K-1) per tensor (seed
  002's implementation quantizes and un-quantizes "each message sent/received"). From a ``bench
  kernels`` document, the measured time of that many elements on that device.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from qbench import catalog
from qbench.cluster import collectives
from qbench.cluster.declared import Cluster, Compute, Host
from qbench.cluster.study import Workload
from qbench.errors import UserError
from qbench.spec.codec_times import CodecTimes


@dataclass(frozen=True)
class Breakdown:
    """One method's projected iteration at one GPU count (seconds; samples per second)."""

    workload: str
    gpus: int
    method: str
    batch: int
    compute_s: float
    codec_s: float
    comm_s: float
    payload_bytes: int
    overlap: bool = False
    """The codec overlaps the transfers (double buffering): the exchange takes the longer."""

    @property
    def iteration_s(self) -> float:
        if self.overlap:
            return self.compute_s + max(self.codec_s, self.comm_s)
        return self.compute_s + self.codec_s + self.comm_s

    @property
    def samples_per_s(self) -> float:
        return self.batch / self.iteration_s


def compute(cluster: Cluster, workload: Workload) -> Compute:
    """What the workload's compute on the device rests on (UserError naming the fix if the
    cluster states nothing for it)."""
    dev = cluster.device
    if workload.name in dev.compute:
        return dev.compute[workload.name]
    if dev.flops_per_s and workload.flops_per_sample:
        speed = dev.flops_per_s * dev.efficiency
        return Compute(seconds=workload.flops_per_sample / speed, batch=1,
                       source=f"{workload.flops_per_sample:.3g} FLOP/sample at "
                              f"{dev.flops_per_s:.3g} FLOP/s x {dev.efficiency:g}")  # fmt: skip
    raise UserError(f"device.compute: no speed for workload {workload.name!r}; add "
                    f"`{workload.name}: {{samples_per_s: ..., batch: ...}}` under device.compute, "
                    "or device.flops_per_s with the workload's flops_per_sample")  # fmt: skip


def predict(
    cluster: Cluster, workload: Workload, method: catalog.CompressorSpec, gpus: int,
    host: Host | None = None, kernels: CodecTimes | None = None,
) -> Breakdown:  # fmt: skip
    """``host``: fitted values of a ``host: calibrated`` cluster; ``kernels``: its codec
    document, which a caller predicting many cells reads once (:func:`kernels_of`), else read
    here."""
    local = local_parts(cluster, workload, method, gpus, kernels)
    comm = collectives.exchange(cluster, local.payload_bytes, gpus, host)
    return dataclasses.replace(local, comm_s=comm)


def local_parts(
    cluster: Cluster, workload: Workload, method: catalog.CompressorSpec, gpus: int,
    kernels: CodecTimes | None = None,
) -> Breakdown:  # fmt: skip
    """The iteration without its exchange (``comm_s`` 0): what needs no link values, which the
    host fit subtracts from a measured iteration."""
    if gpus > cluster.devices:
        raise UserError(f"gpus: {gpus} is more than the cluster's {cluster.devices} devices; "
                        "drop it from the study or declare more nodes")  # fmt: skip
    batch = workload.global_batch(gpus)
    step = compute(cluster, workload).at(batch / gpus)
    payload = _payload(workload, method)
    if payload is None:
        raise UserError(f"method {method.label}: its payload size depends on the data; "
                        "projections need a compressor of fixed size")  # fmt: skip
    codec = codec_s(cluster, workload, method, gpus, kernels) if gpus > 1 else 0.0
    return Breakdown(workload=workload.name, gpus=gpus, method=method.label, batch=batch,
                     compute_s=step, codec_s=codec, comm_s=0.0, payload_bytes=payload,
                     overlap=cluster.double_buffering)  # fmt: skip


def _coded(workload: Workload, method: catalog.CompressorSpec) -> tuple[int, int]:
    """(values, tensors) the method codes: a cast codes all; a compressor the workload's coded
    tensors, the others travelling in fp32."""
    if method.entry.summable:
        return workload.params, workload.tensors
    return workload.coded_params, workload.coded_tensors or workload.tensors


def _payload(workload: Workload, method: catalog.CompressorSpec) -> int | None:
    values, _ = _coded(workload, method)
    coded = method.wire_bytes(values)
    return None if coded is None else coded + 4 * (workload.params - values)


def codec_s(
    cluster: Cluster, workload: Workload, method: catalog.CompressorSpec, k: int,
    kernels: CodecTimes | None,
) -> float:  # fmt: skip
    if method.entry is catalog.FP32.entry:
        return 0.0
    # Lazy: the cost model's traffic tables are read only when a codec is timed.
    from qbench.costmodel.formulas import codec_units

    # a payload an allreduce can sum is allreduced (DDP's fp16 / bf16 hooks); others are not
    scheme = "allreduce" if method.entry.summable else "reduce-broadcast"
    n, tensors = _coded(workload, method)
    enc, dec = codec_units(scheme, k, n, "encode"), codec_units(scheme, k, n, "decode")
    codec = cluster.device.codec
    if codec is None:
        raise UserError(f"device.codec is missing: {method.label} codes its payload; give "
                        "`codec: {encode: 2e10, decode: 2e10, launch: 5us}` (elements/s) or "
                        "`codec: {kernels: FILE}` (qbench bench kernels --json)")  # fmt: skip
    if codec.kernels:
        kernels = kernels or kernels_of(cluster)
        assert kernels is not None
        if not kernels.has(method.label):
            raise UserError(f"device.codec.kernels: {kernels.source} has no times for "
                            f"{method.label}; measure it with `qbench bench kernels --json` "
                            f"or choose one of {', '.join(kernels.labels())}")  # fmt: skip
        return kernels.seconds(method.label, "encode", int(enc)) + kernels.seconds(
            method.label, "decode", int(dec)
        )
    launches = tensors * (2 if method.entry.summable else 2 + 2 * (k - 1))
    return enc / codec.encode + dec / codec.decode + launches * codec.launch


def kernels_of(cluster: Cluster) -> CodecTimes | None:
    codec = cluster.device.codec
    if codec is None or not codec.kernels:
        return None
    return _kernels(codec.kernels)


@functools.lru_cache(maxsize=8)
def _kernels(path: str) -> CodecTimes:
    """A kernels document read once per path: a projection codes every cell with it."""
    return CodecTimes.read(path, "device.codec.kernels")
