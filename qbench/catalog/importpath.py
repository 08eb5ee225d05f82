"""Objects named by import path, ``module.sub:attr``: model and dataset factories, plug-in
codecs and aggregators.

``check`` validates the spelling only (the planner: nothing is imported). ``resolve`` imports
the module and returns the attribute, for the processes that build things (the sweep driver's
pre-run check, the ranks, ``bench``); importing a user's module may import torch, so the planner
never calls it. Modules are found like ``python -m`` finds them: installed packages first, then
the current directory (the sweep's ranks start in the driver's directory).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from qbench.errors import UserError


def check(path: Any, what: str) -> str:
    """``path`` when it is spelt ``module.name:attribute`` (the attribute may be dotted);
    a one-line UserError naming ``what`` otherwise."""
    if isinstance(path, str):
        module, sep, attr = path.partition(":")
        parts = [*module.split("."), *attr.split(".")]
        if sep and all(p.isidentifier() for p in parts):
            return path
    raise UserError(
        f"{what} {path!r} is not an import path; write `module.name:attribute`, e.g. "
        "`mypkg.nets:build`"
    )


def resolve(path: str, what: str) -> Any:
    """The object ``path`` names; UserError naming ``what``, the path and the reason when the
    module cannot be imported or has no such attribute."""
    module_name, _, attr = check(path, what).partition(":")
    module = _import(module_name, path, what)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserError(
                f"{what} {path!r}: module {module_name} has no attribute {attr!r}; check the "
                "name after the colon"
            ) from None
    return obj


def call(path: str, what: str, params: dict[str, Any]) -> Any:
    """Resolve the factory ``path`` and call it with ``params``; UserError naming ``what`` and
    the path when it is not a function or raises (the user's code may raise anything)."""
    named = f"{what} {path!r}"
    fn = resolve(path, what)
    if not callable(fn):
        raise UserError(f"{named} is a {type(fn).__name__}, not a function; point it at one")
    try:
        return fn(**params)
    except Exception as e:
        raise UserError(
            f"{named} raised {type(e).__name__}: {first_line(e)}; check its params"
        ) from e


def first_line(e: BaseException) -> str:
    """An exception's message cut to one line of at most 300 characters, for one-line errors."""
    text = str(e).splitlines()[0] if str(e) else ""
    return text[:300]


def _import(module_name: str, path: str, what: str) -> Any:
    cwd = os.getcwd()
    try:
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if cwd in sys.path or not _top_missing(e, module_name):
                raise
            sys.path.append(cwd)  # like `python -m`: modules beside the scenario, run from there
            return importlib.import_module(module_name)
    except UserError:
        raise
    except Exception as e:  # the user's module may raise anything while importing
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"{what} {path!r} cannot be imported ({type(e).__name__}: {reason}); install its "
            f"package or run from the directory that holds {module_name.split('.')[0]}"
        ) from None


def _top_missing(e: ModuleNotFoundError, module_name: str) -> bool:
    """The missing module is the path's own (not something it imports in turn)."""
    return e.name is not None and (module_name + ".").startswith(e.name + ".")
