"""Tables of catalog entries by name (compressors, schemes) that run hooks before their first
read: qbench.catalog.plugins hooks the loading of installed plug-ins here, so a name a plug-in
registers is found wherever names are looked up, without the tables importing the plug-in
loader (which registers into them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from typing import Protocol, TypeVar

from qbench.errors import UserError

E = TypeVar("E")


class _Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=_Named)
_HOOKS: list[Callable[[], None]] = []


def before_first_read(hook: Callable[[], None]) -> None:
    """Run ``hook`` before any table is read (each read calls it; it makes itself run once)."""
    _HOOKS.append(hook)


def add(table: MutableMapping[str, N], entry: N, what: str) -> None:
    """Register ``entry`` under its name; a name already taken is refused."""
    if entry.name in table:
        raise UserError(f"{what} {entry.name!r} is already registered; pick another name")
    table[entry.name] = entry


def _load() -> None:
    for hook in _HOOKS:
        hook()


class Registry(MutableMapping[str, E]):
    """A table of catalog entries by name that runs the hooks (loading the installed plug-ins)
    before it is read."""

    def __init__(self, entries: dict[str, E]) -> None:
        self._items = dict(entries)

    def __getitem__(self, name: str) -> E:
        _load()
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        _load()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        _load()
        return iter(self._items)

    def __len__(self) -> int:
        _load()
        return len(self._items)

    def __setitem__(self, name: str, entry: E) -> None:
        self._items[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._items[name]

    def __repr__(self) -> str:
        return f"Registry({list(self._items)})"
