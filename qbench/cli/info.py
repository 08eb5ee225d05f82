"""``qbench models`` and ``qbench info``: what qbench and this machine offer."""

from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from qbench.catalog import plugins
from qbench.catalog.model_params import human, significant
from qbench.cli.console import out
from qbench.launch import machine


@click.command()
def models() -> None:
    """List the model zoo with parameter counts."""
    show_models()


@click.command()
def info() -> None:
    """What this machine offers (backends, GPUs, MPI) and why anything is unavailable."""
    show_info()


def show_models() -> None:
    from qbench import (
        models as zoo,  # torch: loaded when the command runs, so that its --help stays fast
    )

    t = Table(title="model zoo (forward GFLOPs per sample: 2 per multiply-add)")
    for col in ("name", "parameters", "grad MB fp32", "GFLOPs/sample", "input", "classes"):
        t.add_column(col, justify="left" if col in ("name", "input") else "right")
    t.add_column("seed")
    t.add_column("description")
    for m in zoo.MODELS.values():
        n = zoo.parameter_count(m.name)
        shape = "x".join(map(str, m.input_shape))
        if not m.input_dtype.is_floating_point:
            shape += f" tokens < {m.vocab_size:,}"
        gflops = zoo.flops_per_sample(m.name) / 1e9
        t.add_row(
            m.name, human(n), significant(n * 4 / 1e6), significant(gflops), shape,
            f"{m.num_classes:,}", m.source, m.description,
        )  # fmt: skip
    out.print(t)
    takes = [name for name, e in zoo.MODELS.items() if e.params]
    out.print(
        f"{', '.join(takes[:-1])} and {takes[-1]} take parameters, e.g. model: "
        "{name: synthetic, params: 25M, gflops: 0.5}; the rows show their defaults."
    )


def show_info() -> None:
    t = Table(title="qbench info")
    t.add_column("what")
    t.add_column("status")
    for what, status in [*machine.capabilities(), *plugins.info_rows()]:
        t.add_row(what, escape(status))  # reasons quote `qbench[cuda12]`: not rich markup
    out.print(t)
