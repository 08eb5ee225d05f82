"""The command line: one module per command group.

Each command parses its options and calls one function (``qbench.cli.console`` prints).
``main`` turns user mistakes into one line on stderr and exit code 2."""

from __future__ import annotations

import sys

import click

from qbench.cli import bench, cost, info, init, report, sweep, timeline
from qbench.errors import UserError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qbench")
def cli() -> None:
    """Benchmark data-parallel training with compressed gradient communication."""


for command in (
    sweep.sweep,
    report.report,
    info.models,
    info.info,
    bench.bench,
    cost.cost,
    timeline.timeline,
):
    cli.add_command(command)
cli.add_command(cost.moved)  # ``qbench model``: hidden, says it moved to ``qbench cost``
cli.add_command(init.init)


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
    return name if name in cli.commands else ""
