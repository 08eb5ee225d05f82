"""Names for people: scheme, compressor and their parameters as figures, tables and pages show
them ("Choco-SGD, ring", "QSGD 4-bit, bucket 512", "DDP fp32", "QSGD 4-bit per DDP bucket").

The facts (what each parameter is called) are the catalog entries' ``display`` functions; the
parameters are the typed specs each run recorded, never parsed from its labels. ``stats.load``
reads every run's specs (``qbench.records.view.run_specs``) into the results' own
:class:`Vocabulary` (label -> spec); tables and figures, which only see the labels, look the
specs up by label (:func:`compressor_spec`, :func:`scheme_spec`, :func:`link`) in the
vocabulary of the results they draw, which :func:`using` puts in scope for the block that draws
them. Nothing is kept between loads: two reports in one process name runs as each of them alone
would (a report once wrote another page after other results had been loaded in the process). A
label no loaded run recorded (a plug-in that is not installed, a file from a newer qbench) is
shown as it is. CSV files keep the machine labels; only what people read is renamed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from qbench import catalog
from qbench.catalog.schemes import spelling
from qbench.records.view import RunParts
from qbench.spec.network import Link

SIMULATED = " (simulated)"
"""The suffix ``stats`` puts on speed-only simulations' compressor labels; names keep it."""

REPLAYED = (
    "replayed compute: ranks slept through the model's work;\nexchanges and codecs ran on each "
    "rank's first-batch gradient; bytes as a real run's (payload sizes set by shapes)"
)


def compute_note(rows: Any) -> str:
    """The line a speed figure's title adds when any of its runs (summary rows: ``replayed``,
    ``dilation``) replayed compute (qbench.run.replay) or was time-dilated, so that a replayed
    result never passes for a run that trained."""
    note = ""
    if "replayed" in rows and rows["replayed"].astype(bool).any():
        note = REPLAYED
    if "dilation" in rows:
        factors = sorted({float(d) for d in rows["dilation"].dropna()} - {1.0})
        if factors:
            note += "\ntime-dilated x" + ", x".join(f"{d:g}" for d in factors)
            note += ", times divided back"
    devices = codec_devices(rows)
    if devices:
        note += "\ncodec time replayed from " + ", ".join(devices)
    return f"\n({note.strip()})" if note else ""


def codec_devices(rows: Any) -> list[str]:
    """The devices whose codec times runs of ``rows`` replayed (``codec_time:``)."""
    if "codec_time" not in rows:
        return []
    return sorted({str(d) for d in rows["codec_time"].dropna() if str(d)})


@dataclass(frozen=True)
class Vocabulary:
    """What the labels of one set of results stand for."""

    compressors: dict[str, catalog.CompressorSpec] = field(default_factory=dict)
    schemes: dict[str, catalog.SchemeSpec] = field(default_factory=dict)
    links: dict[str, Link] = field(default_factory=dict)

    def learn(self, labels: Mapping[str, Any], specs: RunParts) -> None:
        """Remember what a run's ``compressor``, ``scheme`` and ``network`` labels stand for
        (the parts that could be read)."""
        compressor, scheme, network = (labels.get(k) for k in ("compressor", "scheme", "network"))
        if isinstance(compressor, str) and specs.compressor is not None:
            self.compressors[compressor] = specs.compressor
        if isinstance(scheme, str) and specs.scheme is not None:
            self.schemes[scheme] = specs.scheme
        if isinstance(network, str) and specs.link is not None:
            self.links[network] = specs.link

    def merged(self, other: Vocabulary) -> Vocabulary:
        """Both sets' labels (``qbench compare``: a label stands for one spec, the catalog
        makes labels from specs)."""
        return Vocabulary(
            {**self.compressors, **other.compressors},
            {**self.schemes, **other.schemes},
            {**self.links, **other.links},
        )


_IN_SCOPE: ContextVar[Vocabulary | None] = ContextVar("qbench_report_names", default=None)


@contextmanager
def using(vocabulary: Vocabulary) -> Iterator[None]:
    """Name runs by ``vocabulary`` inside the block (nested blocks: the innermost)."""
    token = _IN_SCOPE.set(vocabulary)
    try:
        yield
    finally:
        _IN_SCOPE.reset(token)


def _vocabulary() -> Vocabulary:
    return _IN_SCOPE.get() or _EMPTY


_NONE: Any = MappingProxyType({})
_EMPTY = Vocabulary(_NONE, _NONE, _NONE)
"""Outside any ``using`` block: no label is known (read-only, so nothing is learned here)."""


def compressor_spec(label: object) -> catalog.CompressorSpec | None:
    """The spec a loaded run recorded under this compressor label, or None."""
    return _vocabulary().compressors.get(str(label))


def scheme_spec(label: object) -> catalog.SchemeSpec | None:
    """The spec a loaded run recorded under this scheme label, or None."""
    return _vocabulary().schemes.get(str(label))


def link(label: object) -> Link | None:
    """The link a loaded run recorded under this network label, or None."""
    return _vocabulary().links.get(str(label))


def _split(label: object) -> tuple[str, str]:
    text = str(label)
    return (text.removesuffix(SIMULATED), SIMULATED) if text.endswith(SIMULATED) else (text, "")


def compressor(label: object, brief: bool = False) -> str:
    """``qsgd-4b-b512`` -> "QSGD 4-bit, bucket 512" (brief: "QSGD 4-bit")."""
    text, suffix = _split(label)
    spec = compressor_spec(text)
    return (text if spec is None else spec.display(brief)) + suffix


def scheme(label: object) -> str:
    """``gossip+algorithmchoco+topologyring`` -> "Choco-SGD, ring"."""
    spec = scheme_spec(label)
    return str(label) if spec is None else spec.display()


def method(scheme_label: object, compressor_label: object) -> str:
    """Scheme and compressor as one name: "DDP fp32", "FSDP bf16", "QSGD 4-bit per DDP bucket",
    "Choco-SGD, ring · QSGD 4-bit", "allreduce · fp32"."""
    text, suffix = _split(compressor_label)
    what = compressor(text, brief=True)
    spec = scheme_spec(scheme_label)
    if spec is None:
        return f"{scheme_label} · {what}{suffix}"
    if spec.name in ("ddp", "fsdp"):  # "DDP bf16", "FSDP QSGD 4-bit, all-gather QSGD 8-bit"
        name = spec.display().split(",", 1)[0]
        return spec.display().replace(name, f"{name} {what}", 1) + suffix
    if spelling.overlap(spec.name, spec.params) == "backward":
        rest = spec.display().split(" per DDP bucket", 1)[1]
        exchange = "" if spec.name == "reduce-broadcast" else f" ({spec.name})"
        return f"{what} per DDP bucket{exchange}{rest}{suffix}"
    return f"{spec.display()} · {what}{suffix}"
