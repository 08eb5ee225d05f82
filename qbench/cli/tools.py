"""Click helpers shared by the command groups."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import click


class Lazy(NamedTuple):
    """A command of a :class:`LazyGroup`: where it is (``"module:attribute"``) and the help the
    group's own ``--help`` lists for it without importing the module (tests/cli/test_cli.py checks
    that it is the command's docstring)."""

    target: str
    help: str
    hidden: bool = False


class LazyGroup(click.Group):
    """A group whose commands are imported when one is invoked or its help shown (click's
    "Lazily Loading Subcommands"), so that ``qbench --help`` imports none of them and each
    command's module imports what it needs at its top: ``qbench sweep --dry-run`` never loads
    the modules of ``qbench bench`` or ``qbench info``, which import torch."""

    def __init__(self, name: str | None = None, *, lazy: Mapping[str, Lazy], **attrs: Any) -> None:
        super().__init__(name, **attrs)
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = self.lazy[cmd_name].target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[cmd_name].target} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, with each lazy command's help taken from its :class:`Lazy`."""
        listed = [(name, self._listed(ctx, name)) for name in self.list_commands(ctx)]
        shown = [(name, c) for name, c in listed if c is not None and not c.hidden]
        if not shown:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in shown)
        with formatter.section("Commands"):
            formatter.write_dl([(name, c.get_short_help_str(limit)) for name, c in shown])

    def _listed(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.lazy:
            return super().get_command(ctx, name)
        entry = self.lazy[name]  # shortened by click as the command's own docstring would be
        return click.Command(name, help=entry.help, hidden=entry.hidden)


class ListCommand(click.Command):
    """``multiple`` options also take space-separated lists: ``--world-size 2 4 8`` means
    ``--world-size 2 --world-size 4 --world-size 8`` (positional arguments go first)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        lists = {
            o for p in self.params if isinstance(p, click.Option) and p.multiple for o in p.opts
        }
        expanded: list[str] = []
        current, pending = "", False  # the list option being read; its first value still due
        for a in args:
            if a.startswith("-") and not _is_number(a):
                name = a.split("=", 1)[0]
                current = name if name in lists else ""
                pending = bool(current) and "=" not in a
            elif current and not pending:
                expanded.append(current)  # one more item of the same list
            else:
                pending = False
            expanded.append(a)
        return super().parse_args(ctx, expanded)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
