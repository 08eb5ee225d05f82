"""User-facing errors: one line, exit code 2, no traceback.

Also the small pieces every such message is built from, kept here once.
"""

from __future__ import annotations

from collections.abc import Iterable


class UserError(ValueError):
    """A mistake in user input (scenario, option, file) that the user can fix.

    The message names the bad value, the rule it breaks and a fix, on one line.
    """


def choice_error(what: str, value: object, valid: list[str] | tuple[str, ...]) -> UserError:
    """Error for a name that is not in a registry: the nearest valid name, then all of them."""
    hint = did_you_mean(value, valid) if isinstance(value, str) else ""
    return UserError(f"unknown {what} {value!r}{hint}; valid: {', '.join(sorted(valid))}")


def type_name(value: object) -> str:
    """The YAML-ish type of a bad value for error messages: ``null`` for None, else its type."""
    return "null" if value is None else type(value).__name__


def did_you_mean(word: object, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` with the valid name nearest ``word``, or "" when none is near."""
    import difflib  # only on the error path

    close = difflib.get_close_matches(str(word), list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
