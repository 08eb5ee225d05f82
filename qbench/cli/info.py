"""``qbench models`` and ``qbench info``: what qbench and this machine offer."""

from __future__ import annotations

import click


@click.command()
def models() -> None:
    """List the model zoo with parameter counts."""
    from qbench.cli import console

    console.models()


@click.command()
def info() -> None:
    """What this machine offers (backends, GPUs, MPI) and why anything is unavailable."""
    from qbench.cli import console

    console.info()
