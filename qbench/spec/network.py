"""Network settings of a run: unshaped (the default) or an emulated link (``bandwidth``).

Pure validation and labelling, and the emulated link's token bucket size (which the cost model
reads too); the namespaces and ``tc`` shaping live in ``qbench.launch``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from qbench.errors import UserError

KEYS = ("bandwidth",)
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*(kbit|mbit|gbit)$")
_UNIT = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
TBF_MIN_BURST_BYTES = 16 * 1024
"""The smallest tbf bucket (> 10 full frames), so that low rates do not stall on single frames."""


def parse(raw: Any) -> dict[str, Any]:
    """``unshaped`` / ``{}`` -> {}; ``{bandwidth: 1gbit}`` -> {"bandwidth": "1gbit"}."""
    if raw in ("unshaped", None, {}):
        return {}
    if not isinstance(raw, dict):
        raise UserError(
            f"network entry {raw!r} must be `unshaped` or a mapping like {{bandwidth: 1gbit}}"
        )
    out = {str(k): v for k, v in raw.items()}
    check(out)
    return out


def check(net: dict[str, Any]) -> None:
    for k in net:
        if k not in KEYS:
            shown = k if isinstance(k, str) and k.isprintable() else repr(k)  # one line
            raise UserError(f"unknown key network.{shown}; valid: {', '.join(KEYS)}")
    if "bandwidth" in net:
        bits_per_s(net["bandwidth"])


def bits_per_s(rate: Any) -> float:
    m = _RATE.match(str(rate).strip().lower())
    bits = float(m.group(1)) * _UNIT[m.group(2)] if m else math.nan
    if not 1 <= bits < math.inf:  # nan: no match; inf: hundreds of digits; tc needs >= 1 bit/s
        raise UserError(
            f"network.bandwidth must be a positive rate in kbit/mbit/gbit, got {rate!r}; "
            "e.g. `bandwidth: 1gbit`"
        )
    return bits


def label(net: dict[str, Any]) -> str:
    return str(net["bandwidth"]).replace(" ", "") if net.get("bandwidth") else "unshaped"


def tbf_burst_bytes(rate_bits_per_s: float) -> int:
    """Bytes of the tbf bucket of an emulated link: 2 ms of traffic at the rate, at least
    ``TBF_MIN_BURST_BYTES`` (why: ``qbench.launch.netns.tbf_for``). A call that starts on a full
    bucket gets that much transfer free, so the cost model credits it."""
    rate = int(rate_bits_per_s)
    return max(rate // 8 // 500, TBF_MIN_BURST_BYTES)


def tbf_burst_s(rate_bits_per_s: float) -> float:
    """Seconds of traffic the tbf bucket holds at that rate (2 ms from 65.5 Mbit/s up)."""
    return tbf_burst_bytes(rate_bits_per_s) * 8 / rate_bits_per_s
