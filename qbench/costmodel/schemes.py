"""The schemes and compressors the cost model knows.

A scheme is the catalog's (``qbench.catalog.scheme``: the one spec syntax, validated by the
catalog's rules) as the model sees it, ``Scheme.of(spec)``: a run's recorded spec
(``qbench.records.view``), a bench JSON row's label read back by the catalog
(``inputs.bench_scheme``), or ``--scheme reduce-broadcast:overlap=16``
(``qbench.cli.cost.configs.scheme_option``). DDP runs, which communicate bucket by bucket
during backward (``qbench.costmodel.overlap``), are ``ddp`` or
``reduce-broadcast:backward=true``. The model's only scheme of its own is ``lowprec-allreduce``,
the *projected* NCCL with native low-precision reduction, not measurable yet: its predictions
say so (mode ``projected``). Compressor labels (``fp32``, ``fp16``, ``qsgd-4b-b512``, ...) are
keys of the model's tables; what a compressor is and sends is read from its catalog spec
(``Config.compressor``), never from its label.
"""

from __future__ import annotations

from dataclasses import dataclass

from qbench import catalog
from qbench.catalog.schemes import TORCH_HOOKS, spelling, traffic
from qbench.errors import UserError
from qbench.spec import rules

PROJECTED = "lowprec-allreduce"
"""NCCL with native low-precision reduction: not measurable yet, so predictions are projected."""
PROJECTED_FROM = catalog.SCHEMES["allreduce"].name
"""The measured scheme the projection stands for: where it cannot carry a compressor, the
reason names the projection that could."""
DDP = spelling.DDP
"""PyTorch DDP with torch's hooks (``TORCH_HOOKS``): buckets communicated during backward."""
OWN: dict[str, traffic.Declared] = {
    PROJECTED: lambda x: traffic.simulated_lowprec(x, padded=False),
}
"""The model's own schemes and their traffic: the projection is simulated-lowprec's allreduce
without its padding to whole floats, timed by simulated-lowprec's codec fits."""


def declared(name: str) -> traffic.Declared | None:
    """The traffic the scheme declares (``qbench.catalog.schemes.traffic``); None for DDP's
    loop (timed bucket by bucket, ``qbench.costmodel.overlap``) and schemes the model cannot
    time."""
    entry = catalog.SCHEMES.get(name)
    return OWN.get(name) or (entry.traffic if entry is not None else None)


def _levelled(name: str) -> bool:
    """Whether the scheme's traffic names its levels (inside a node, between nodes): such a
    scheme is timed from the one-level fits, never fitted itself (qbench.costmodel.levels)."""
    of = declared(name)
    return of is not None and traffic.names_levels(of, catalog.FP32)


SCHEMES = (
    *(name for name, e in catalog.SCHEMES.items() if e.traffic is not None), PROJECTED, DDP,
)  # fmt: skip
"""The schemes the model times: those whose traffic the catalog declares, its own projection,
and DDP's loop."""
BACKWARD_SCHEMES = tuple(
    n for n in SCHEMES if n in catalog.SCHEMES and catalog.SCHEMES[n].per_bucket
    and not _levelled(n)
)  # fmt: skip
"""Flat schemes the model knows that can also run per DDP bucket during backward
(``backward: true``; a plug-in's are not modelled)."""
BACKWARD, FLAT = "backward", "none"
"""The two ``overlap`` labels of runs: buckets during backward, or one gradient after it."""
FP32 = "fp32"
POWERSGD = "powersgd"


@dataclass(frozen=True)
class Scheme:
    name: str
    overlap: int = 1
    backward: bool = False
    """Per DDP bucket during backward (always for ``ddp``)."""
    bucket_cap_mb: float | None = None
    """DDP's bucket size cap as the run's label gives it (None: torch's default, 25 MB)."""
    intra: str = "none"
    """``hierarchical``: the codec of the sum inside a node (none = fp32, fp16, bf16)."""
    inter: str = "reduce-scatter"
    """``hierarchical``: the exchange between nodes (reduce-scatter, reduce-broadcast,
    allgather among node leaders)."""

    def __post_init__(self) -> None:
        if self.name == DDP:  # DDP always communicates bucket by bucket during backward
            object.__setattr__(self, "backward", True)

    @classmethod
    def of(cls, spec: catalog.SchemeSpec) -> Scheme:
        """The catalog's validated scheme (a run's recorded spec, ``qbench.records.view``) as
        the model sees it; UserError for a scheme the model has no formulas for."""
        name, p = spec.name, spec.params
        given = spec.given.get("bucket_cap_mb")  # the label names the cap only when given
        cap = None if given is None else float(given)
        levels: dict[str, str] = {k: str(p[k]) for k in ("intra", "inter") if k in p}
        backward = bool(p.get("backward")) or name == DDP
        return cls._timed(name, int(p.get("overlap", 1)), backward, cap, levels)

    @classmethod
    def _timed(
        cls, name: str, overlap: int, backward: bool, cap: float | None, levels: dict[str, str]
    ) -> Scheme:
        """The scheme as the model times it; UserError for what it has no formulas for."""
        if name != DDP and declared(name) is None:
            raise UserError(f"the cost model has no scheme {name!r}; valid: {', '.join(SCHEMES)}")
        if backward and overlap > 1:
            raise UserError(f"scheme {name}: the cost model has no per-bucket pipeline")
        if backward and _levelled(name):
            raise UserError(f"scheme {name}: the cost model has no per-bucket {name}")
        name = spelling.canonical(name, {"backward": backward}, NONE.name)[0]
        return cls(name, overlap, backward, cap, **levels)

    @property
    def label(self) -> str:
        """As runs record it (``qbench.spec.matrix.scheme_label``)."""
        backward = "+backward" if self.backward and self.name != DDP else ""
        cap = f"+bucket_cap_mb{self.bucket_cap_mb}" if self.bucket_cap_mb is not None else ""
        levels = (f"+intra{self.intra}" if self.intra != "none" else "") + (
            f"+{self.inter}" if self.inter != "reduce-scatter" else ""
        )
        pipe = f"+overlap{self.overlap}" if self.overlap > 1 else ""
        return self.name + backward + cap + levels + pipe

    @property
    def mode(self) -> str:
        if self.backward:
            return BACKWARD
        if self.name == PROJECTED:
            return "projected"
        if self.name in catalog.SCHEMES and not catalog.SCHEMES[self.name].reduces:
            return "simulated"
        return "overlap" if self.overlap > 1 else "breakdown"

    @property
    def params(self) -> dict[str, str]:
        """What the traffic reads besides the pipeline depth: the levels' exchanges."""
        return {"intra": self.intra, "inter": self.inter}

    @property
    def levelled(self) -> bool:
        """Its traffic runs per level, so the model times it from one-level fits only."""
        return _levelled(self.name)

    @property
    def exchange(self) -> Scheme:
        """The flat scheme that carries each bucket (``ddp``: torch's allreduce)."""
        return Scheme("allreduce" if self.name == DDP else self.name)

    def per_bucket(self, overlap: str | None) -> Scheme:
        """This scheme under a run's ``overlap`` label (None: the scheme's own)."""
        if overlap in (None, BACKWARD if self.backward else FLAT):
            return self
        if overlap == BACKWARD:
            if self.name not in BACKWARD_SCHEMES:
                raise UserError(
                    f"scheme {self.label}: only {', '.join(BACKWARD_SCHEMES)} run per bucket "
                    "during backward"
                )
            return Scheme._timed(self.name, self.overlap, True, None, {})
        if overlap == FLAT:
            raise UserError(f"scheme {self.label} communicates during backward, not `overlap none`")
        raise UserError(f"overlap must be {BACKWARD} or {FLAT}, got {overlap!r}")


ALLREDUCE = Scheme("allreduce")
"""fp32 allreduce of one flat gradient: the baseline of every prediction."""


NONE = catalog.FP32


def full_precision(compressor: catalog.CompressorSpec) -> bool:
    """Whether the compressor sends fp32 values as they are (the catalog's ``none``)."""
    return compressor.name == NONE.name


def is_torch_hook(compressor: catalog.CompressorSpec) -> bool:
    """Compressors ``ddp`` runs with torch's own hooks (fp32 allreduce, casts, PowerSGD)."""
    return compressor.name in TORCH_HOOKS


def is_powersgd(compressor: catalog.CompressorSpec) -> bool:
    return compressor.name == POWERSGD


def nominal_bits_per_value(compressor: catalog.CompressorSpec) -> float | None:
    """Wire bits per value of a fixed-size compressor (the catalog's wire layout, metadata
    included, at 2^20 values); None when the size depends on the data or the shapes."""
    n = 2**20
    wire = compressor.wire_bytes(n)
    return None if wire is None else 8 * wire / n


def incompatibility(scheme: Scheme, compressor: catalog.CompressorSpec) -> str | None:
    """Why the scheme cannot carry this compressor (None when it can): the catalog's rules,
    plus the projected NCCL native low-precision allreduce, which only the cost model knows."""
    if scheme.name in OWN:
        return None
    params = {"backward": True} if scheme.backward and scheme.name != DDP else {}
    why = rules.incompatibility("gloo", scheme.name, compressor, params=params)
    if why and scheme.name == PROJECTED_FROM:
        why += f"; `{PROJECTED}` projects a native low-precision allreduce"
    return why
