"""Options that several commands take, declared once (each command gives its own help text),
and shorthands for the kinds of option the commands declare: switches, lists, values with a
default that ``--help`` shows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def flag(*decls: str, help: str) -> Callable[[F], F]:
    """An on/off switch, e.g. ``--dry-run``."""
    return click.option(*decls, is_flag=True, help=help)


def listed(
    *decls: str, help: str | None = None, metavar: str | None = None, type: Any = None
) -> Callable[[F], F]:
    """A list: the option repeated or, under ``ListCommand``, its values one after another."""
    return click.option(*decls, multiple=True, metavar=metavar, type=type, help=help)


def setting(
    *decls: str, default: Any, help: str | None = None, type: Any = None,
    metavar: str | None = None,
) -> Callable[[F], F]:  # fmt: skip
    """A value whose default ``--help`` shows."""
    return click.option(
        *decls, type=type, default=default, show_default=True, metavar=metavar, help=help
    )


def specs(name: str, dest: str, help: str) -> Callable[[F], F]:
    """``--compressor`` or ``--scheme``: catalog specs, ``NAME[:KEY=VALUE,...]``, repeatable."""
    return listed(name, dest, metavar="SPEC", help=help)


def world_sizes(help: str) -> Callable[[F], F]:
    """``--world-size``: ranks, repeatable."""
    return listed("--world-size", "world_sizes", type=int, help=help)


def repeats(help: str, type: Any = int) -> Callable[[F], F]:
    """``--repeats``: timed calls or samples per point (5)."""
    return setting("--repeats", type=type, default=5, help=help)


def threads(help: str) -> Callable[[F], F]:
    """``--threads``: torch intra-op threads (1)."""
    return setting("--threads", type=click.IntRange(min=1), default=1, help=help)


def json_file(help: str) -> Callable[[F], F]:
    """``--json FILE``: a bench's machine-readable output, besides its tables."""
    return click.option("--json", "json_path", type=click.Path(dir_okay=False), help=help)


def out_file(help: str) -> Callable[[F], F]:
    """``--out FILE``, required: the file a command writes."""
    return click.option("--out", required=True, type=click.Path(dir_okay=False), help=help)


def table_format(choices: tuple[str, ...]) -> Callable[[F], F]:
    """``--format``: a table for people (the default) or a format for programs."""
    return setting("--format", "fmt", type=click.Choice(choices), default="table")
