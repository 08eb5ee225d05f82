"""The schemes and compressors the cost model knows, by the labels runs and benches record.

``Scheme.parse`` reads a scheme label (``reduce-broadcast+overlap16``); compressor labels
(``fp32``, ``fp16``, ``qsgd-4b-b512``, ...) give their wire bits per value where the label alone
says it. ``lowprec-allreduce`` is the *projected* NCCL with native low-precision reduction, not
measurable yet: its predictions say so (mode ``projected``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qbench.errors import UserError

PROJECTED = "lowprec-allreduce"
"""NCCL with native low-precision reduction: not measurable yet, so predictions are projected."""


SCHEMES = (
    "allreduce",
    "reduce-broadcast",
    "allgather",
    "integer-allreduce",
    "simulated-lowprec",
    PROJECTED,
)


PIPELINED = ("reduce-broadcast", "integer-allreduce")


FP32 = "fp32"


SUMMABLE_INT_BYTES = {"mpi": (1, 2, 4), "gloo": (1, 4), "nccl": (1, 4)}
"""Integer widths each backend sums (qbench.aggregate.integer_allreduce._SUMMABLE)."""


_QSGD = re.compile(r"^qsgd-(\d+)b-b(\d+)")


@dataclass(frozen=True)
class Scheme:
    name: str
    overlap: int = 1

    @classmethod
    def parse(cls, text: str) -> Scheme:
        """``reduce-broadcast``, ``reduce-broadcast+overlap16``, ``reduce-broadcast:overlap=16``."""
        raw = str(text).strip()
        name, _, rest = raw.partition(":")
        params: dict[str, str] = {}
        if "+" in name:
            name, *extra = name.split("+")
            for e in extra:
                m = re.fullmatch(r"([a-z_]+?)(\d+)", e)
                if not m:
                    raise UserError(f"scheme {raw!r}: cannot read {e!r}; e.g. `+overlap16`")
                params[m.group(1)] = m.group(2)
        for item in filter(None, (s.strip() for s in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise UserError(f"scheme {raw!r}: {item!r} is not KEY=VALUE; e.g. `:overlap=16`")
            params[key.strip()] = value.strip()
        if name not in SCHEMES:
            raise UserError(f"the cost model has no scheme {name!r}; valid: {', '.join(SCHEMES)}")
        if set(params) - {"overlap"}:
            raise UserError(f"scheme {raw!r}: unknown parameter {sorted(params)[0]!r}")
        try:
            overlap = int(params.get("overlap", "1"))
        except ValueError:
            raise UserError(f"scheme {raw!r}: overlap must be a whole number") from None
        if overlap < 1 or (overlap > 1 and name not in PIPELINED):
            raise UserError(
                f"scheme {raw!r}: overlap must be >= 1 and needs one of {', '.join(PIPELINED)}"
            )
        return cls(name, overlap)

    @property
    def label(self) -> str:
        return self.name + (f"+overlap{self.overlap}" if self.overlap > 1 else "")

    @property
    def mode(self) -> str:
        if self.name == PROJECTED:
            return "projected"
        if self.name == "simulated-lowprec":
            return "simulated"
        return "overlap" if self.overlap > 1 else "breakdown"


def qsgd_params(compressor: str) -> tuple[int, int] | None:
    """(bits, bucket_size) of a qsgd label like ``qsgd-4b-b512``."""
    m = _QSGD.match(compressor)
    return (int(m.group(1)), int(m.group(2))) if m else None


def nominal_bits_per_value(compressor: str) -> float | None:
    """Wire bits per value known from the label alone (fp32, fp16, bf16, qsgd)."""
    if compressor == FP32:
        return 32.0
    if compressor in ("fp16", "bf16"):
        return 16.0
    q = qsgd_params(compressor)
    return q[0] + 32 / q[1] if q else None


def incompatibility(scheme: Scheme, compressor: str) -> str | None:
    """Why the scheme cannot carry this compressor (None when it can)."""
    if scheme.name == "allreduce" and compressor not in (FP32, "fp16", "bf16"):
        return (
            f"allreduce sums raw buffers and cannot carry {compressor}; "
            f"`{PROJECTED}` projects a native low-precision allreduce"
        )
    if scheme.name == "integer-allreduce" and compressor != FP32:
        q = qsgd_params(compressor)
        if q is None or q[0] < 2 or "-l2" in compressor:
            return f"integer-allreduce needs qsgd with bits >= 2 and norm max, got {compressor}"
    return None


def int_sum_bytes(backend: str, k: int, bits: int) -> int:
    """Width of integer-allreduce's integers: the narrowest the backend sums without overflow
    for K ranks at level 2^(bits-1) - 1 (qbench.aggregate.integer_allreduce.sum_dtype)."""
    bound = k * ((1 << (bits - 1)) - 1)
    for width in SUMMABLE_INT_BYTES.get(backend, SUMMABLE_INT_BYTES["gloo"]):
        if bound <= 2 ** (8 * width - 1) - 1:
            return width
    raise UserError(f"integer-allreduce: {k} ranks x {bits}-bit levels overflow int32")
