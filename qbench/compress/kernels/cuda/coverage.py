"""Line coverage of the CUDA kernels run by the emulator
(python -m qbench.compress.kernels.cuda.coverage).

Builds the emulated kernels with gcov counters (-O0 --coverage) in a fresh directory, runs every
kernel of qbench.compress.kernels.cuda through the compressors as QBENCH_CUDA=emulate does (both
norms and layouts, fused and two-kernel QSGD, 16-bit codes, strided bucket trees, 1-bit with and
without error feedback, every FP8 / MX / NVFP4 element format, decodes with and without
accumulate, the integer view's ends at every integer width), then reads the counters back with
gcov. Counted: every line of kernels/*.cu, and the lines of the shared headers that the
kernels compile for the device (__CUDA_ARCH__ is defined, as under nvcc). A line of a template
counts as run only when every instantiation ran it. Exit status 1 when any line never ran.
`make cuda-coverage` runs it and keeps gcov's annotated sources in kernels/build/coverage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from qbench.compress import from_spec, integer_sum
from qbench.compress.base import Key
from qbench.compress.kernels import abi as kernel_abi
from qbench.compress.kernels import cuda, native
from qbench.compress.kernels.cuda import emulate
from qbench.compress.lowfloat import FP8, MX, NVFP4
from qbench.compress.onebit import OneBit
from qbench.compress.qsgd import QSGD


@dataclass(frozen=True)
class FileCoverage:
    path: Path
    runs: dict[int, int]
    """Line number -> times run (the least over the functions that contain the line)."""

    @property
    def missed(self) -> list[int]:
        return sorted(line for line, count in self.runs.items() if count == 0)


@dataclass(frozen=True)
class Report:
    files: list[FileCoverage]

    @property
    def lines(self) -> int:
        return sum(len(f.runs) for f in self.files)

    @property
    def covered(self) -> int:
        return self.lines - sum(len(f.missed) for f in self.files)

    @property
    def percent(self) -> float:
        return 100.0 * self.covered / self.lines if self.lines else 0.0

    def render(self) -> str:
        out = [f"{'file':<16} {'lines':>6} {'run':>6} {'cover':>7}"]
        for f in self.files:
            run = len(f.runs) - len(f.missed)
            share = 100 * run / len(f.runs) if f.runs else 100.0
            out.append(f"{f.path.name:<16} {len(f.runs):>6} {run:>6} {share:>6.1f}%")
        out.append(f"{'total':<16} {self.lines:>6} {self.covered:>6} {self.percent:>6.1f}%")
        for f in self.files:
            text = f.path.read_text().splitlines()
            out += [f"never run: {f.path.name}:{n}: {text[n - 1].strip()}" for n in f.missed]
        return "\n".join(out)


def exercise() -> None:
    """Every kernel and every path through them, on small tensors."""
    x = torch.randn(2053, generator=torch.Generator().manual_seed(0))
    x[:600] = 0.0  # an all-zero bucket: the codes a zero scale skips
    for bits, layout, norm, bucket_size in [
        (4, "intervals", "max", 8),  # one pass (qb_qsgd_encode_vec): a thread per bucket
        (5, "intervals", "l2", 16),  # the l2 butterfly, within a warp
        (3, "sign", "l2", 512),  # a bucket over two warps: swaps through shared memory
        (2, "intervals", "max", 128),  # 2-, 8- and 16-bit codes: one access per group
        (8, "sign", "max", 512),
        (16, "intervals", "l2", 8192),  # 1024 threads per bucket
        (16, "sign", "max", 7),  # two kernels: groups of 8 cross buckets; 16-bit codes
        (2, "intervals", "l2", 300),  # two kernels, the strided tree
    ]:
        c = QSGD(bits=bits, layout=layout, norm=norm, bucket_size=bucket_size)
        payload = c.encode(x, step=1)
        c.decode(payload)
        c.decode(payload, out=torch.ones(x.numel()))
    c = QSGD(norm="l2", bucket_size=8)  # views 4 bytes in: qb_qsgd_encode_fused, qb_qsgd_decode
    c.decode(c.encode(x[1:], step=1), out=torch.ones(x.numel())[1:])
    for bucket_size, error_feedback in [(5, True), (300, True), (64, False)]:
        onebit = OneBit(bucket_size=bucket_size, error_feedback=error_feedback)
        for _ in range(2):  # no residual yet, then the residual updated in place
            payload = onebit.encode(x, name="w")
        onebit.decode(payload)
        onebit.decode(payload, out=torch.ones(x.numel()))
    _exercise_lowfloat(x)
    _exercise_units(x)


def _exercise_units(x: torch.Tensor) -> None:
    """The integer view of FP8 / MX / NVFP4: both roundings, every integer width."""
    for spec, dtype in [("mx", torch.int8), ("mx:rounding=stochastic", torch.int16),
                        ("fp8:block_size=7", torch.int32),
                        ("nvfp4:scope=global,rounding=stochastic", torch.int64)]:  # fmt: skip
        view = integer_sum.for_compressor(from_spec(spec))
        assert view is not None
        scales = view.share(view.local_scales(x))
        sums = view.encode(x, scales, Key(step=1), 0, dtype)
        view.decode(sums, scales, 2, torch.empty(x.numel()))


def _exercise_lowfloat(x: torch.Tensor) -> None:
    """FP8 / MX / NVFP4: every element format, blocks that groups of 8 straddle, one scale per
    tensor, stochastic rounding, error feedback (NaN and inf through the residual: the NaN
    codes), decodes with and without accumulate, and a NaN gradient (refused)."""
    residual = torch.zeros(x.numel())
    residual[5:8] = torch.tensor([math.nan, math.inf, -math.inf])
    codecs = [FP8(format="e4m3", block_size=7, error_feedback=True),
              FP8(format="e5m2", rounding="stochastic", error_feedback=True),
              NVFP4(rounding="stochastic", error_feedback=True)]  # fmt: skip
    codecs += [MX(element=e) for e in ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")]
    for codec in codecs:
        if codec.error_feedback:
            codec.state["w"] = residual.clone()
        payload = codec.encode(x, name="w")
        codec.decode(payload)
        codec.decode(payload, out=torch.ones(x.numel()))
    with contextlib.suppress(ValueError):
        MX().encode(torch.tensor([1.0, math.nan]))


def measure(keep: Path | None = None) -> Report:
    """Build with counters, run exercise(), read the counts; gcov's sources into keep if given."""
    with tempfile.TemporaryDirectory(prefix="qbench-cuda-coverage-") as tmp:
        build = Path(tmp)
        library = emulate.build(cuda._SOURCES, coverage=True, directory=build)
        emu = emulate.Emulator(library)
        with (
            emulate.substituted(cuda._SOURCES, emu),
            native.backend("native"),
            emulate.emulation("emulate"),
        ):
            exercise()
        emu.coverage_dump()
        unit = library.with_suffix(".cpp")
        gcov = shutil.which("gcov") or "gcov"
        cmd = [gcov, "--json-format", "--stdout", "--object-directory", str(build), str(unit)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=build, timeout=300)
        if proc.returncode:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-500:]}")
        report = _report(json.loads(proc.stdout))
        if keep is not None:
            _annotate(gcov, build, unit, report, keep)
        return report


def _annotate(gcov: str, build: Path, unit: Path, report: Report, keep: Path) -> None:
    """gcov's annotated copies of the kernel sources (name.cu.gcov: counts beside each line)."""
    with tempfile.TemporaryDirectory(dir=build) as tmp:
        cmd = [gcov, "--object-directory", str(build), str(unit)]
        subprocess.run(cmd, capture_output=True, cwd=tmp, timeout=300)
        keep.mkdir(parents=True, exist_ok=True)
        for f in report.files:  # not the system headers gcov also annotates
            annotated = Path(tmp) / f"{f.path.name}.gcov"
            if annotated.is_file():
                shutil.copy(annotated, keep / annotated.name)


def _report(data: dict[str, object]) -> Report:
    kdir = kernel_abi.kernel_dir().resolve()
    files = []
    for entry in data["files"]:  # type: ignore[attr-defined]
        path = Path(entry["file"]).resolve()
        if path.parent != kdir or path.suffix not in (".cu", ".h"):
            continue  # the shim, the generated unit and system headers are no kernel lines
        runs: dict[int, int] = {}
        for line in entry["lines"]:
            n, count = line["line_number"], line["count"]
            runs[n] = min(runs.get(n, count), count)
        files.append(FileCoverage(path, runs))
    return Report(sorted(files, key=lambda f: (f.path.suffix != ".cu", f.path.name)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qbench.compress.kernels.cuda.coverage", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, help="keep gcov's annotated sources (*.gcov) here")
    args = parser.parse_args(argv)
    try:
        report = measure(args.out)
    except RuntimeError as exc:
        print(f"cuda-coverage: {exc}", file=sys.stderr)
        return 2
    print(report.render())
    return 0 if report.covered == report.lines and report.lines else 1


if __name__ == "__main__":
    sys.exit(main())
