"""Network settings of a run: unshaped (the default) or an emulated link (``bandwidth``).

Pure validation and labelling, and the emulated link's token bucket size (which the cost model
reads too); the namespaces and ``tc`` shaping live in ``qbench.launch``. A rate is parsed here
only: :func:`link` turns a checked setting (a scenario entry, a recorded ``network`` mapping, an
option) into a :class:`Link`, whose ``bits_per_s`` everything downstream reads; its ``label``
is for people and run ids and is never parsed back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qbench.errors import UserError

KEYS = ("bandwidth",)
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*(kbit|mbit|gbit)$")
_UNIT = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
TBF_MIN_BURST_BYTES = 16 * 1024
"""The smallest tbf bucket (> 10 full frames), so that low rates do not stall on single frames."""
UNSHAPED = "unshaped"
"""The label of a link that is not emulated (loopback between processes of one host)."""


@dataclass(frozen=True)
class Link:
    """A checked link: ``bits_per_s`` of the emulated rate, None when unshaped; ``label`` for
    people and run ids (``1gbit``, ``unshaped``), made from the setting as written."""

    bits_per_s: float | None = None
    label: str = UNSHAPED

    @property
    def shaped(self) -> bool:
        return self.bits_per_s is not None


def link(net: Mapping[str, Any]) -> Link:
    """The link of a network setting (``{}`` or ``{bandwidth: 1gbit}``; UserError if bad)."""
    _check_keys(net)
    if "bandwidth" not in net:
        return Link()
    return Link(bits_per_s(net["bandwidth"]), label(net))


def option(text: str | None) -> Link:
    """The link of a rate option (``1gbit``; None or ``unshaped``: none)."""
    if text is None or str(text).strip().lower() == UNSHAPED:
        return Link()
    return link({"bandwidth": text})


def at_rate(bps: float) -> Link:
    """A link at a computed rate (the cost model's probes), labelled ``12.5gbit``, ``300mbit``."""
    unit, div = ("gbit", 1e9) if bps >= 1e9 else ("mbit", 1e6) if bps >= 1e6 else ("kbit", 1e3)
    return Link(bps, f"{bps / div:.9f}".rstrip("0").rstrip(".") + unit)


def parse(raw: Any) -> dict[str, Any]:
    """``unshaped`` / ``{}`` -> {}; ``{bandwidth: 1gbit}`` -> {"bandwidth": "1gbit"}."""
    if raw in (UNSHAPED, None, {}):
        return {}
    if not isinstance(raw, dict):
        raise UserError(
            f"network entry {raw!r} must be `unshaped` or a mapping like {{bandwidth: 1gbit}}"
        )
    out = {str(k): v for k, v in raw.items()}
    check(out)
    return out


def check(net: Mapping[str, Any]) -> None:
    link(net)


def _check_keys(net: Mapping[str, Any]) -> None:
    for k in net:
        if k not in KEYS:
            shown = k if isinstance(k, str) and k.isprintable() else repr(k)  # one line
            raise UserError(f"unknown key network.{shown}; valid: {', '.join(KEYS)}")


def bits_per_s(rate: Any) -> float:
    """The rate parser (``1gbit`` -> 1e9). Call :func:`link` / :func:`option` instead: a test
    (tests/test_network_link.py) lists the modules that still parse a rate themselves."""
    m = _RATE.match(str(rate).strip().lower())
    bits = float(m.group(1)) * _UNIT[m.group(2)] if m else math.nan
    if not 1 <= bits < math.inf:  # nan: no match; inf: hundreds of digits; tc needs >= 1 bit/s
        raise UserError(
            f"network.bandwidth must be a positive rate in kbit/mbit/gbit, got {rate!r}; "
            "e.g. `bandwidth: 1gbit`"
        )
    return bits


def label(net: Mapping[str, Any]) -> str:
    return str(net["bandwidth"]).replace(" ", "") if net.get("bandwidth") else UNSHAPED


def tbf_burst_bytes(rate_bits_per_s: float) -> int:
    """Bytes of the tbf bucket of an emulated link: 2 ms of traffic at the rate, at least
    ``TBF_MIN_BURST_BYTES`` (why: ``qbench.launch.netns.tbf_for``). A call that starts on a full
    bucket gets that much transfer free, so the cost model credits it."""
    rate = int(rate_bits_per_s)
    return max(rate // 8 // 500, TBF_MIN_BURST_BYTES)


def tbf_burst_s(rate_bits_per_s: float) -> float:
    """Seconds of traffic the tbf bucket holds at that rate (2 ms from 65.5 Mbit/s up)."""
    return tbf_burst_bytes(rate_bits_per_s) * 8 / rate_bits_per_s
