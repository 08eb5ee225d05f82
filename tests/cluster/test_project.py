"""The projection's pieces by hand-computed cases (issue 46): compute from FLOPs, a codec from a
measured kernels file, the payload of a workload whose small tensors travel in fp32, one GPU,
the breakdown's fields, the table's speedup / scalability / band, and the band file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from qbench import catalog
from qbench.cluster import project, table, validate
from qbench.cluster.declared import Cluster, Codec, Compute, Device, Link
from qbench.cluster.study import Study, Workload
from qbench.errors import UserError
from qbench.spec.codec_times import SCHEMA, CodecTimes

QSGD = catalog.compressor({"name": "qsgd", "bits": 4, "bucket_size": 512})
LINK = Link(rate=10e9, latency=0.0)
W = Workload(name="w", params=1_000_000, tensors=10, batch={1: 16, 2: 32, 4: 64})


def _cluster(**device: object) -> Cluster:
    dev = Device(name="d", **device)  # type: ignore[arg-type]
    return Cluster(name="c", nodes=1, devices_per_node=4, device=dev, collective="nccl-ring",
                   intra=LINK)  # fmt: skip


def test_compute_from_flops() -> None:
    # 1e12 FLOP a sample at 1e15 FLOP/s x 0.5: 2 ms a sample; 16 a GPU at 4 GPUs: 32 ms
    cluster = _cluster(flops_per_s=1e15, efficiency=0.5)
    w = dataclasses.replace(W, flops_per_sample=1e12)
    c = project.compute(cluster, w)
    assert (c.seconds, c.batch) == (pytest.approx(2e-3), 1)
    assert c.at(16) == pytest.approx(32e-3)
    assert c.source == "1e+12 FLOP/sample at 1e+15 FLOP/s x 0.5"
    # FLOPs need both the device's speed and the workload's count
    with pytest.raises(UserError, match=r"device\.compute: no speed for workload 'w'"):
        project.compute(_cluster(flops_per_s=1e15, efficiency=0.5), W)


def _kernels(tmp_path: Path) -> CodecTimes:
    """encode 1 ns a value, decode 2 ns, measured at 1e6 and 1e7 values (linear between)."""
    rows = [{"compressor": QSGD.label, "op": op, "numel": n, "seconds": n * per,
             "copy_seconds": n * 1e-10} for op, per in (("encode", 1e-9), ("decode", 2e-9))
            for n in (1_000_000, 10_000_000)]  # fmt: skip
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"schema": SCHEMA, "device": "cpu", "rows": rows}))
    return CodecTimes.read(path)


def test_a_codec_from_a_kernels_file(tmp_path: Path) -> None:
    # among 4: encode n (1 + 1/4) = 1.25M values at 1 ns, decode 2M at 2 ns: 1.25 + 4 ms
    kernels = _kernels(tmp_path)
    cluster = _cluster(codec=Codec(kernels="k.json"))
    w = dataclasses.replace(W, params=1_000_000)
    assert project.codec_s(cluster, w, QSGD, 4, kernels) == pytest.approx(1.25e-3 + 4e-3)
    bf16 = catalog.compressor("bf16")
    with pytest.raises(UserError) as e:
        project.codec_s(cluster, w, bf16, 4, kernels)
    assert str(e.value) == (
        f"device.codec.kernels: {kernels.source} has no times for bf16; measure it with "
        "`qbench bench kernels --json` or choose one of qsgd-4b-b512"
    )


def test_a_kernels_file_is_read_once_and_used(tmp_path: Path) -> None:
    _kernels(tmp_path)
    cluster = _cluster(codec=Codec(kernels=str(tmp_path / "k.json")),
                       compute={"w": Compute(0.1, 16, "stated")})  # fmt: skip
    kernels = project.kernels_of(cluster)
    assert kernels is not None and kernels.labels() == [QSGD.label]
    b = project.predict(cluster, W, QSGD, 4, kernels=kernels)
    assert b.codec_s == pytest.approx(1.25e-3 + 4e-3)
    assert project.kernels_of(_cluster(codec=Codec(encode=1, decode=1))) is None
    with pytest.raises(UserError, match=r"^device\.codec\.kernels: .*nope\.json cannot be read"):
        project.kernels_of(_cluster(codec=Codec(kernels=str(tmp_path / "nope.json"))))


def test_small_tensors_travel_in_fp32() -> None:
    # half the values coded: QSGD 4-bit of 500,000 values (250,000 code bytes + 977 scales x 4)
    # and 500,000 fp32 values
    w = dataclasses.replace(W, coded_tensors=3, coded_share=0.5)
    cluster = _cluster(compute={"w": Compute(0.1, 16, "stated")},
                       codec=Codec(encode=1e9, decode=1e9, launch=1e-6))  # fmt: skip
    b = project.predict(cluster, w, QSGD, 4)
    assert b.payload_bytes == 250_000 + 977 * 4 + 4 * 500_000
    # its codec: 500,000 values (1.25 + 2 units at 1e9/s), 3 tensors x (2 + 6) kernels at 1 us
    assert b.codec_s == pytest.approx(500_000 * 3.25 / 1e9 + 24e-6)
    # a cast codes every value and tensor
    assert project.predict(cluster, w, catalog.compressor("bf16"), 4).payload_bytes == 2_000_000


def test_one_gpu_neither_codes_nor_exchanges() -> None:
    cluster = _cluster(compute={"w": Compute(0.1, 16, "stated")},
                       codec=Codec(encode=1e9, decode=1e9, launch=1e-6))  # fmt: skip
    b = project.predict(cluster, W, QSGD, 1)
    assert (b.workload, b.gpus, b.method, b.batch) == ("w", 1, QSGD.label, 16)
    assert (b.compute_s, b.codec_s, b.comm_s, b.overlap) == (pytest.approx(0.1), 0.0, 0.0, False)
    assert b.samples_per_s == pytest.approx(160.0)
    overlapped = dataclasses.replace(cluster, double_buffering=True)
    assert project.predict(overlapped, W, QSGD, 2).overlap is True


def test_refusals_are_one_line_naming_the_fix() -> None:
    cluster = _cluster(compute={"w": Compute(0.1, 16, "stated")})
    with pytest.raises(UserError) as e:
        project.predict(cluster, W, QSGD, 8)
    assert str(e.value) == ("gpus: 8 is more than the cluster's 4 devices; drop it from the "
                            "study or declare more nodes")  # fmt: skip
    with pytest.raises(UserError) as e:
        project.predict(cluster, W, QSGD, 2)
    assert str(e.value) == (
        "device.codec is missing: qsgd-4b-b512 codes its payload; give `codec: {encode: 2e10, "
        "decode: 2e10, launch: 5us}` (elements/s) or `codec: {kernels: FILE}` (qbench bench "
        "kernels --json)"
    )
    adaptive = catalog.compressor("adaptive")
    with pytest.raises(UserError) as e:
        project.predict(cluster, W, adaptive, 2)
    assert str(e.value) == (f"method {adaptive.label}: its payload size depends on the data; "
                            "projections need a compressor of fixed size")  # fmt: skip
    with pytest.raises(UserError) as e:
        project.compute(cluster, dataclasses.replace(W, name="v"))
    assert str(e.value) == (
        "device.compute: no speed for workload 'v'; add `v: {samples_per_s: ..., batch: ...}` "
        "under device.compute, or device.flops_per_s with the workload's flops_per_sample"
    )


def test_the_table_speedup_scalability_and_band(tmp_path: Path) -> None:
    # at 2 GPUs each computes 16 samples in 0.1 s; fp32 ring allreduce of 4 MB at 10 GB/s among
    # 2: 0.4 ms; bf16 2 MB: 0.2 ms + its codec (1M values each way at 1e9/s, 20 kernels at 1 us:
    # 2.02 ms)
    cluster = _cluster(compute={"w": Compute(0.1, 16, "stated")},
                       codec=Codec(encode=1e9, decode=1e9, launch=1e-6))  # fmt: skip
    validate.write_band({"low": -0.1, "high": 0.25, "cells": 7, "source": "s"}, tmp_path / "b")
    cluster = dataclasses.replace(cluster, band=str(tmp_path / "b"))
    plan = Study(name="s", gpus=(1, 2), workloads=(W,), methods=(catalog.FP32,
                 catalog.compressor("bf16")))  # fmt: skip
    result = table.projection(cluster, plan, None)
    f = result.frame.set_index(["gpus", "method"])
    assert list(result.frame.columns) == list(table.COLUMNS)
    fp32_2 = 32 / (0.1 + 4e6 / 1e10)
    assert f.loc[(2, "fp32"), "samples_per_s"] == pytest.approx(fp32_2)
    assert f.loc[(2, "bf16"), "iteration_ms"] == pytest.approx(1e3 * (0.1 + 2e6 / 1e10 + 2.02e-3))
    # fp32 is faster here: the baseline for both; bf16's speedup below 1; nothing pays
    assert f.loc[(2, "bf16"), "baseline"] == "fp32" and not f["pays"].any()
    assert f.loc[(2, "bf16"), "speedup"] == pytest.approx(f.loc[(2, "bf16"), "samples_per_s"]
                                                          / fp32_2)  # fmt: skip
    # scalability over the best at 1 GPU (160 samples/s)
    assert f.loc[(2, "fp32"), "scalability"] == pytest.approx(fp32_2 / 160)
    # the band: measured = predicted / (1 + error), error in [-10 %, +25 %]
    assert f.loc[(2, "fp32"), "band_low"] == pytest.approx(fp32_2 / 1.25)
    assert f.loc[(2, "fp32"), "band_high"] == pytest.approx(fp32_2 / 0.9)
    assert result.band == validate.Band(low=-0.1, high=0.25, cells=7, source="s")


def test_a_bad_band_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "b").write_text("{}")
    with pytest.raises(UserError) as e:
        validate.read_band(str(tmp_path / "b"))
    assert str(e.value) == (
        f"band: {tmp_path / 'b'} is not a band file; write one with `qbench project CLUSTER STUDY "
        "--against CELLS.csv --band-out FILE`"
    )
