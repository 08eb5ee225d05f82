"""One spec syntax for compressors and schemes, wherever they are written.

* YAML: a name (``qsgd``) or a mapping (``{name: qsgd, bits: 4}``);
* command line and, equally, inside a scenario: ``qsgd:bits=4,bucket_size=512`` (values read
  as YAML: ``4``, ``0.01``, ``true``);
* labels in tables and run ids (``qsgd-4b-b512``): made by each catalog entry, never parsed.

:func:`mapping` turns any of the first two into ``{name: ..., <parameter>: ...}``;
:func:`to_cli` writes a mapping back in the command-line form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from qbench.errors import UserError


def parse_cli(text: str, what: str = "compressor") -> dict[str, Any]:
    """``qsgd:bits=4,bucket_size=512`` -> ``{"name": "qsgd", "bits": 4, "bucket_size": 512}``."""
    name, _, rest = text.partition(":")
    spec: dict[str, Any] = {"name": name.strip()}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise UserError(
                f"{what} spec {text!r}: {item!r} is not KEY=VALUE; e.g. `{_example(what)}`"
            )
        try:
            spec[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UserError(f"{what} spec {text!r}: {value!r} is not a YAML value") from None
    if not spec["name"]:
        raise UserError(f"{what} spec {text!r} has no name; e.g. `{_example(what)}`")
    return spec


def mapping(raw: Any, what: str = "compressor") -> dict[str, Any]:
    """A spec as YAML or the command line gives it -> ``{name: ..., <parameter>: ...}``."""
    if isinstance(raw, str):
        return parse_cli(raw, what) if ":" in raw else {"name": raw}
    if isinstance(raw, Mapping):
        if "name" not in raw:
            raise UserError(f"{what} {dict(raw)!r} has no name; e.g. `{_example_mapping(what)}`")
        odd = next((k for k in raw if not isinstance(k, str)), None)
        if odd is not None:
            raise UserError(f"{what} {raw['name']!r}: parameter names are strings, got {odd!r}")
        return dict(raw)
    raise UserError(
        f"{what} must be a name or a mapping with a name, got {raw!r}; "
        f"e.g. `{_example_mapping(what)}`"
    )


def to_cli(spec: Mapping[str, Any]) -> str:
    """``{"name": "qsgd", "bits": 4}`` -> ``qsgd:bits=4`` (the inverse of :func:`parse_cli`)."""
    params = ",".join(f"{k}={_yaml(v)}" for k, v in spec.items() if k != "name")
    return f"{spec['name']}:{params}" if params else str(spec["name"])


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _example(what: str) -> str:
    return (
        "--scheme reduce-broadcast:overlap=4" if what == "scheme" else "qsgd:bits=4,bucket_size=512"
    )


def _example_mapping(what: str) -> str:
    return "{name: reduce-broadcast, overlap: 4}" if what == "scheme" else "{name: qsgd, bits: 4}"
