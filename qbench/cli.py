"""Command line: each command parses its options and calls one function. No logic here."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

import click

from qbench.clitools import ListCommand
from qbench.errors import UserError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qbench")
def cli() -> None:
    """Benchmark data-parallel training with compressed gradient communication."""


@cli.command()
@click.argument("scenario", required=False)
@click.option("--out", type=click.Path(file_okay=False), help="Results directory [results/<name>].")
@click.option(
    "--dry-run", is_flag=True, help="Print the run matrix and excluded rows; run nothing."
)
@click.option(
    "--launcher", type=click.Choice(["local", "slurm"]), default=None,
    help="How runs start [the scenario's `launcher:`, else local].",
)  # fmt: skip
@click.option(
    "--retry-failed", is_flag=True,
    help="Also redo runs that failed or timed out in an earlier sweep (by default they are "
    "kept; interrupted runs are always redone).",
)  # fmt: skip
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE",
    help="Replace a top-level scenario key (VALUE is YAML), e.g. --set seed=0 "
    "--set 'world_size=[1,2,4,8]' --set backend=nccl.",
)  # fmt: skip
def sweep(
    scenario: str | None, out: str | None, dry_run: bool, launcher: str | None,
    retry_failed: bool, sets: tuple[str, ...],
) -> None:  # fmt: skip
    """Run every combination of SCENARIO's axes (default: the embedded smoke scenario).

    Re-running skips runs already complete, so an interrupted sweep resumes where it stopped."""
    from qbench import console
    from qbench import scenario as scenario_mod

    text, source = _scenario_text(scenario)
    text = scenario_mod.with_overrides(text, source, sets)
    console.sweep(
        text, source, Path(out) if out else None, dry_run, launcher=launcher,
        retry_failed=retry_failed,
    )  # fmt: skip


@cli.command()
@click.argument("directory")
@click.argument("other", required=False)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "md", "json"]), default="table",
    help="How to print the summary (files are always written to DIR/report/).",
)  # fmt: skip
def report(directory: str, other: str | None, fmt: str) -> None:
    """Summarise DIRECTORY's runs: tables and figures in DIRECTORY/report/.

    With OTHER: compare OTHER (B) against DIRECTORY (A, the baseline) per matching
    configuration, with the ratio of iteration times and whether it is beyond the noise
    (written to OTHER/report/compare.{csv,md})."""
    from qbench import console

    if other is not None:
        console.compare(Path(directory), Path(other), fmt)
        return
    console.report(Path(directory), fmt)


@cli.command()
def models() -> None:
    """List the model zoo with parameter counts."""
    from qbench import console

    console.models()


@cli.command()
def info() -> None:
    """What this machine offers (backends, GPUs, MPI) and why anything is unavailable."""
    from qbench import console

    console.info()


@cli.group()
def bench() -> None:
    """Micro-benchmarks of single pieces (compression kernels, ...), apart from sweeps."""


@bench.command(cls=ListCommand)
@click.option(
    "--compressor",
    "specs",
    multiple=True,
    metavar="SPEC",
    help="NAME[:KEY=VALUE,...], e.g. qsgd:bits=4,bucket_size=512 (repeatable) [the default "
    "families that are registered].",
)
@click.option(
    "--sizes",
    multiple=True,
    type=int,  # the range is checked (and explained) by qbench.bench.kernels
    default=(16, 20, 24),
    show_default=True,
    help="log2 of the element counts, e.g. --sizes 16 20 24 26.",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Timed calls per op (median reported), after one warm-up.",
)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="torch intra-op threads (1 = like one CPU rank).",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "torch", "native"]),
    default="auto",
    show_default=True,
    help="Compressor code path: compiled kernels when built (auto), the torch reference, or "
    "compiled only (native).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    help="Also write the rows and provenance to this JSON file.",
)
def kernels(
    specs: tuple[str, ...], sizes: tuple[int, ...], repeats: int, device: str, threads: int,
    backend: str, json_path: str | None,
) -> None:  # fmt: skip
    """Encode/decode time of each compressor against a plain copy of the same tensor."""
    from qbench.bench import kernels_command

    path = Path(json_path) if json_path else None
    kernels_command(specs, sizes, repeats, device, threads, backend, path)


@bench.command(cls=ListCommand)
@click.option(
    "--backend", "backends", multiple=True, type=click.Choice(["gloo", "mpi", "nccl"]),
    help="Backends, e.g. --backend gloo mpi [gloo].",
)  # fmt: skip
@click.option(
    "--world-size", "world_sizes", multiple=True, type=int,
    help="Ranks per launch, e.g. --world-size 2 4 [2].",
)  # fmt: skip
@click.option(
    "--scheme", "schemes", multiple=True, metavar="SPEC",
    help="NAME[:KEY=VALUE,...], e.g. reduce-broadcast:overlap=4 [every registered scheme "
    "with a mean result; fp32 allreduce is always added as the baseline].",
)  # fmt: skip
@click.option(
    "--compressor", "compressors", multiple=True, metavar="SPEC",
    help="NAME[:KEY=VALUE,...], e.g. qsgd:bits=4,bucket_size=512 [none, fp16, qsgd 4-bit b512].",
)  # fmt: skip
@click.option("--min-bytes", default="8", show_default=True, help="Smallest fp32 gradient.")
@click.option(
    "--max-bytes", default="64M", show_default=True,
    help="Largest fp32 gradient (always measured), e.g. 256M.",
)  # fmt: skip
@click.option(
    "--step-factor", type=int, default=4, show_default=True, help="Size multiplier per step."
)
@click.option(
    "--repeats", type=int, default=5, show_default=True,
    help="Timed calls per size (median of the max over ranks).",
)  # fmt: skip
@click.option("--warmup", type=int, default=2, show_default=True, help="Untimed calls first.")
@click.option(
    "--bandwidth", metavar="RATE",
    help="Emulate links of this rate, one network namespace per rank (root), e.g. 1gbit.",
)  # fmt: skip
@click.option(
    "--sync", type=click.Choice(["barrier", "stream"]), default="barrier", show_default=True,
    help="barrier: before every timed call; stream: calls back to back as in a training loop "
    "(with --gap-ms: what ranks sharing cores see).",
)  # fmt: skip
@click.option(
    "--gap-ms", type=float, default=0.0, show_default=True,
    help="Busy milliseconds before every call, like a training step's compute (the link idles; "
    "an emulated link's token bucket refills), e.g. --sync stream --gap-ms 10.",
)  # fmt: skip
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False),
    help="Also write the rows, speedups and provenance to this JSON file.",
)  # fmt: skip
def comm(
    backends: tuple[str, ...], world_sizes: tuple[int, ...], schemes: tuple[str, ...],
    compressors: tuple[str, ...], min_bytes: str, max_bytes: str, step_factor: int,
    repeats: int, warmup: int, bandwidth: str | None, sync: str, gap_ms: float,
    json_path: str | None,
) -> None:  # fmt: skip
    """nccl-tests style size sweep of gradient aggregation: time, algbw/busbw, wire bytes,
    relative error, speedup over fp32 allreduce."""
    from qbench.bench import comm as bench_comm

    s = bench_comm.settings(
        backends=backends, world_sizes=world_sizes, schemes=schemes, compressors=compressors,
        min_bytes=min_bytes, max_bytes=max_bytes, step_factor=step_factor, repeats=repeats,
        warmup=warmup, bandwidth=bandwidth, sync=sync, gap_ms=gap_ms,
    )  # fmt: skip
    bench_comm.command(s, Path(json_path) if json_path else None)


def _register_cost_group() -> None:
    """``qbench cost fit | predict | validate`` (qbench/cost_cli.py: the cost model), and its
    old name ``qbench model`` (hidden; says that it moved)."""
    from qbench import cost_cli

    cli.add_command(cost_cli.cost)
    cli.add_command(cost_cli.moved)


_register_cost_group()


def _scenario_text(scenario: str | None) -> tuple[str, str]:
    if scenario is None:
        return resources.files("qbench").joinpath("default.yaml").read_text(), "<embedded default>"
    p = Path(scenario)
    if not p.is_file():
        raise UserError(f"scenario file {scenario!r} not found; check the path (see scenarios/)")
    return p.read_text(), scenario


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except UserError as e:
        click.echo(f"qbench: error: {e}", err=True)
        sys.exit(2)
    except click.UsageError as e:
        click.echo(f"qbench: error: {e.format_message()} (see `qbench {_cmd()} --help`)", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo("qbench: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("qbench: interrupted; completed runs are kept, re-run to resume", err=True)
        sys.exit(130)


def _cmd() -> str:
    return sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else ""


if __name__ == "__main__":
    main()
