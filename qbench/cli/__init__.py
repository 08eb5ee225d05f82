"""The command line: one module per command group.

Each command parses its options and calls one function (``qbench.cli.console`` prints a
sweep). ``main`` turns user mistakes into one line on stderr and exit code 2. The commands are
loaded lazily (``COMMANDS``): ``qbench --help`` imports none of their modules."""

from __future__ import annotations

import sys

import click

from qbench.cli.tools import Lazy, LazyGroup
from qbench.errors import UserError

COMMANDS = {
    "sweep": Lazy("qbench.cli.sweep:sweep", "Run every combination of SCENARIO's axes (default: "
                  "the embedded smoke scenario)."),
    "report": Lazy("qbench.cli.report:report", "Summarise DIRECTORY's runs: tables and figures "
                   "in DIRECTORY/report/."),
    "models": Lazy("qbench.cli.info:models", "List the model zoo with parameter counts."),
    "info": Lazy("qbench.cli.info:info", "What this machine offers (backends, GPUs, MPI) and why "
                 "anything is unavailable."),
    "bench": Lazy("qbench.cli.bench:bench", "Micro-benchmarks of single pieces (compression "
                  "kernels, ...), apart from sweeps."),
    "cost": Lazy("qbench.cli.cost:cost", "Cost model: fit alpha-beta, codec, compute and DDP "
                 "bucket parameters; predict; find the crossover with DDP fp32; validate."),
    "project": Lazy("qbench.cli.project:project", "Project a study's methods onto a declared "
                    "cluster, with the error band its validation measured."),
    "timeline": Lazy("qbench.cli.timeline:timeline", "Derive a replay timeline for the one "
                     "workload of SCENARIO from its FLOPs."),
    # ``qbench model``: hidden, says it moved to ``qbench cost``
    "model": Lazy("qbench.cli.cost:moved", "Moved to `qbench cost` (the cost model).", hidden=True),
    "init": Lazy("qbench.cli.init:init", "Write a commented starter scenario to FILE "
                 "[scenario.yaml]; never overwrites a file."),
}  # fmt: skip
"""Each command's name -> where it is and its help (``qbench --help`` lists it from here)."""


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qbench")
def cli() -> None:
    """Benchmark data-parallel training with compressed gradient communication."""


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except UserError as e:
        click.echo(f"qbench: error: {e}", err=True)
        sys.exit(2)
    except click.UsageError as e:
        help_for = " ".join(filter(None, ("qbench", _cmd(), "--help")))
        click.echo(f"qbench: error: {e.format_message()} (see `{help_for}`)", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo("qbench: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("qbench: interrupted; completed runs are kept, re-run to resume", err=True)
        sys.exit(130)


def _cmd() -> str:
    """The command the user typed, when it is one (``qbench --help`` for anything else)."""
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    return name if name in COMMANDS else ""
