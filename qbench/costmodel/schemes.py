"""The schemes and compressors the cost model knows.

``Scheme.of`` reads a catalog scheme spec: a run's recorded one (``qbench.records.view``), or a
bench JSON row's label read back by the catalog (``inputs.bench_scheme``). ``Scheme.parse``
reads ``--scheme`` and ``Config.scheme`` (still a label):
``reduce-broadcast+overlap16``, and for DDP runs, which communicate bucket by bucket during
backward (``qbench.costmodel.overlap``), ``ddp`` or ``reduce-broadcast+backward``. Compressor
labels (``fp32``, ``fp16``, ``qsgd-4b-b512``, ...) give their wire bits per value where the
label alone says it. ``lowprec-allreduce`` is the *projected* NCCL with native low-precision
reduction, not measurable yet: its predictions say so (mode ``projected``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from qbench import catalog
from qbench.catalog import rules
from qbench.catalog.schemes import TORCH_HOOKS, integer_sum_bytes
from qbench.errors import UserError

PROJECTED = "lowprec-allreduce"
"""NCCL with native low-precision reduction: not measurable yet, so predictions are projected."""
DDP = rules.DDP
"""PyTorch DDP with torch's hooks (``TORCH_HOOKS``): buckets communicated during backward."""
SCHEMES = (
    "allreduce",
    "reduce-broadcast",
    "allgather",
    "integer-allreduce",
    "simulated-lowprec",
    PROJECTED,
    DDP,
)
PIPELINED = ("reduce-broadcast", "integer-allreduce")
BACKWARD_SCHEMES = tuple(
    n for n in SCHEMES if n in catalog.SCHEMES and catalog.SCHEMES[n].per_bucket
)
"""Flat schemes the model knows that can also run per DDP bucket during backward
(``+backward``; a plug-in's are not modelled)."""
BACKWARD, FLAT = "backward", "none"
"""The two ``overlap`` labels of runs: buckets during backward, or one gradient after it."""
FP32 = "fp32"
POWERSGD = "powersgd"
_PLUS = re.compile(r"([a-z_]+?)(\d+(?:\.\d+)?|True|False)?")
_KEYS = ("overlap", "backward", "bucket_cap_mb", "gradient_as_bucket_view")


@dataclass(frozen=True)
class Scheme:
    name: str
    overlap: int = 1
    backward: bool = False
    """Per DDP bucket during backward (always for ``ddp``)."""
    bucket_cap_mb: float | None = None
    """DDP's bucket size cap as the run's label gives it (None: torch's default, 25 MB)."""

    @classmethod
    def parse(cls, text: str) -> Scheme:
        """``reduce-broadcast``, ``reduce-broadcast+overlap16``, ``reduce-broadcast:overlap=16``;
        ``ddp``, ``ddp+bucket_cap_mb10.0``, ``reduce-broadcast+backward``,
        ``reduce-broadcast:backward=true``. ``allreduce`` per bucket is ``ddp``."""
        raw = str(text).strip()
        name, params = _split(raw)
        if name not in SCHEMES:
            raise UserError(f"the cost model has no scheme {name!r}; valid: {', '.join(SCHEMES)}")
        unknown = sorted(set(params) - set(_KEYS))
        if unknown:
            raise UserError(f"scheme {raw!r}: unknown parameter {unknown[0]!r}")
        try:
            overlap = int(params.get("overlap", "1"))
        except ValueError:
            raise UserError(f"scheme {raw!r}: overlap must be a whole number") from None
        if overlap < 1 or (overlap > 1 and name not in PIPELINED):
            raise UserError(
                f"scheme {raw!r}: overlap must be >= 1 and needs one of {', '.join(PIPELINED)}"
            )
        backward = _flag(raw, "backward", params.get("backward", "false")) or name == DDP
        _flag(raw, "gradient_as_bucket_view", params.get("gradient_as_bucket_view", "false"))
        cap = _cap(raw, params.get("bucket_cap_mb"))
        if backward and name not in (DDP, *BACKWARD_SCHEMES):
            raise UserError(
                f"scheme {raw!r}: only {', '.join(BACKWARD_SCHEMES)} run per bucket during backward"
            )
        if not backward and (cap is not None or "gradient_as_bucket_view" in params):
            raise UserError(f"scheme {raw!r}: DDP options need `backward=true` (or ddp)")
        if backward and overlap > 1:
            raise UserError(f"scheme {raw!r}: the cost model has no per-bucket pipeline")
        return cls(DDP if backward and name == "allreduce" else name, overlap, backward, cap)

    @classmethod
    def of(cls, spec: catalog.SchemeSpec) -> Scheme:
        """The catalog's validated scheme (a run's recorded spec, ``qbench.records.view``) as
        the model sees it; UserError for a scheme the model has no formulas for."""
        name, p = spec.name, spec.params
        if name not in SCHEMES:
            raise UserError(f"the cost model has no scheme {name!r}; valid: {', '.join(SCHEMES)}")
        backward = bool(p.get("backward")) or name == DDP
        overlap = int(p.get("overlap", 1))
        if backward and overlap > 1:
            raise UserError(f"scheme {name}: the cost model has no per-bucket pipeline")
        given = spec.given.get("bucket_cap_mb")  # the label names the cap only when given
        cap = None if given is None else float(given)
        return cls(DDP if backward and name == "allreduce" else name, overlap, backward, cap)

    @property
    def label(self) -> str:
        """As runs record it (``qbench.spec.matrix.scheme_label``)."""
        backward = "+backward" if self.backward and self.name != DDP else ""
        cap = f"+bucket_cap_mb{self.bucket_cap_mb}" if self.bucket_cap_mb is not None else ""
        return self.name + backward + cap + (f"+overlap{self.overlap}" if self.overlap > 1 else "")

    @property
    def mode(self) -> str:
        if self.backward:
            return BACKWARD
        if self.name == PROJECTED:
            return "projected"
        if self.name == "simulated-lowprec":
            return "simulated"
        return "overlap" if self.overlap > 1 else "breakdown"

    @property
    def exchange(self) -> Scheme:
        """The flat scheme that carries each bucket (``ddp``: torch's allreduce)."""
        return Scheme("allreduce" if self.name == DDP else self.name)

    def per_bucket(self, overlap: str | None) -> Scheme:
        """This scheme under a run's ``overlap`` label (None: the scheme's own)."""
        if overlap in (None, BACKWARD if self.backward else FLAT):
            return self
        if overlap == BACKWARD:
            return Scheme.parse(f"{self.label}:backward=true")
        if overlap == FLAT:
            raise UserError(f"scheme {self.label} communicates during backward, not `overlap none`")
        raise UserError(f"overlap must be {BACKWARD} or {FLAT}, got {overlap!r}")


def _split(raw: str) -> tuple[str, dict[str, str]]:
    """``name+key<value>...:key=value,...`` -> (name, {key: value})."""
    name, _, rest = raw.partition(":")
    params: dict[str, str] = {}
    name, *extra = name.split("+")
    for e in extra:
        m = _PLUS.fullmatch(e)
        if not m:
            raise UserError(f"scheme {raw!r}: cannot read {e!r}; e.g. `+overlap16`")
        params[m.group(1)] = m.group(2) if m.group(2) is not None else "true"
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise UserError(f"scheme {raw!r}: {item!r} is not KEY=VALUE; e.g. `:overlap=16`")
        params[key.strip()] = value.strip()
    return name, params


def _flag(raw: str, key: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise UserError(f"scheme {raw!r}: {key} must be true or false, got {value!r}")
    return value.lower() == "true"


def _cap(raw: str, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        cap = float(value)
    except ValueError:
        cap = math.nan
    if not 0 < cap <= 1e5:
        raise UserError(f"scheme {raw!r}: bucket_cap_mb must be a size in MB > 0, got {value!r}")
    return cap


def _spec(compressor: str) -> catalog.CompressorSpec | None:
    """The catalog's compressor behind a label (None for a label no entry makes)."""
    try:
        return catalog.from_label(compressor)
    except UserError:
        return None


def is_torch_hook(compressor: str) -> bool:
    """Compressors ``ddp`` runs with torch's own hooks (fp32 allreduce, casts, PowerSGD)."""
    spec = _spec(compressor)
    return spec is not None and spec.name in TORCH_HOOKS


def is_powersgd(compressor: str) -> bool:
    """Whether a label is PowerSGD's (the catalog entry that makes it, not its spelling)."""
    spec = _spec(compressor)
    return spec is not None and spec.name == POWERSGD


def qsgd_params(compressor: str) -> tuple[int, int] | None:
    """(bits, bucket_size) of a qsgd label like ``qsgd-4b-b512``."""
    spec = _spec(compressor)
    if spec is None or spec.name != "qsgd":
        return None
    return spec.params["bits"], spec.params["bucket_size"]


def nominal_bits_per_value(compressor: str) -> float | None:
    """Wire bits per value of a fixed-size compressor (the catalog's wire layout, metadata
    included, at 2^20 values); None when the size depends on the data or the shapes."""
    spec = _spec(compressor)
    n = 2**20
    wire = spec.wire_bytes(n) if spec is not None else None
    return None if wire is None else 8 * wire / n


def incompatibility(scheme: Scheme, compressor: str) -> str | None:
    """Why the scheme cannot carry this compressor (None when it can): the catalog's rules,
    plus the projected NCCL native low-precision allreduce, which only the cost model knows."""
    if scheme.name == PROJECTED:
        return None
    spec = _spec(compressor)
    if spec is None:
        return f"no compressor has the label {compressor!r}"
    params = {"backward": True} if scheme.backward and scheme.name != DDP else {}
    why = rules.incompatibility("gloo", scheme.name, spec.given, params=params)
    if why and scheme.name == "allreduce":
        why += f"; `{PROJECTED}` projects a native low-precision allreduce"
    return why


def int_sum_bytes(backend: str, k: int, bits: int) -> int:
    """Width of integer-allreduce's integers: the narrowest the backend sums without overflow
    for K ranks at level 2^(bits-1) - 1 (qbench.catalog.schemes.integer_sum_bytes)."""
    width = integer_sum_bytes(backend, k, (1 << (bits - 1)) - 1)
    if width is None:
        raise UserError(f"integer-allreduce: {k} ranks x {bits}-bit levels overflow int32")
    return width
