"""Click helpers shared by the command groups."""

from __future__ import annotations

import click


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
