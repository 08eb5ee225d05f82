"""What the run's data, model and compute allow: text corpora, FSDP's shards, replayed codec
time."""

from __future__ import annotations

from qbench import catalog
from qbench.catalog import models as zoo
from qbench.catalog.datasets import TEXT_DATASETS, TEXT_VOCAB
from qbench.catalog.schemes.spelling import FSDP, overlap
from qbench.spec import codec_times
from qbench.spec.rules.candidate import Candidate
from qbench.spec.rules.methods import Rule


def _fsdp_weights(c: Candidate) -> str | None:
    if c.scheme == FSDP and c.weight_bits:
        return (
            f"weights: {{bits: {c.weight_bits}}} rounds a replica's parameters after the step; "
            "FSDP keeps shards, not replicas; drop `weights:` for fsdp"
        )
    return None


def _text(c: Candidate) -> str | None:
    """A text corpus feeds a model whose every position predicts the next byte, and such a
    model reads nothing else (but its synthetic tokens)."""
    if not c.model:
        return None
    per_token = not c.factory and zoo.entry(c.model).per_token
    text = c.dataset in TEXT_DATASETS
    if text and not per_token:
        return (
            f"dataset {c.dataset} is a text corpus read as bytes, each position predicting the "
            f"next; model {c.model} does not; use model gpt"
        )
    if per_token and not text and c.dataset != "synthetic":
        return f"model {c.model} reads token sequences; use dataset fortunes or synthetic"
    if text and c.skew:
        return f"skew {c.skew:g} partitions by label, and text has none; drop skew for {c.dataset}"
    vocab = int(c.model_params.get("vocab", TEXT_VOCAB)) if per_token else TEXT_VOCAB
    if text and vocab < TEXT_VOCAB:
        return f"model {c.model} has vocab {vocab} < {TEXT_VOCAB} bytes; set vocab: {TEXT_VOCAB}"
    return None


def _codec_time(c: Candidate) -> str | None:
    """Replayed codec time covers the flat loop's encode and decode calls of compressors the
    file measured."""
    if not c.codec_time or c.compressor.name == "none":
        return None
    if overlap(c.scheme, c.params) == "backward":
        return (
            "codec_time replays the flat loop's codec calls; DDP's hooks and FSDP's "
            "collectives run theirs inside backward: use compressor none with DDP or FSDP, or "
            "a flat scheme"
        )
    if not catalog.SCHEMES[c.scheme].codec_calls:
        return (
            f"codec_time replays compressors' encode and decode calls; {c.scheme} quantizes with "
            "kernels of its own that `bench kernels` does not time: drop it or `codec_time:`"
        )
    times = codec_times.read_once(c.codec_time)
    if not times.has(c.compressor.label):
        return (
            f"codec_time: {c.codec_time} has no encode and decode rows of "
            f"{c.compressor.label} (it has {', '.join(times.labels()) or 'none'}); measure them "
            "with `qbench bench kernels --compressor ...` on that device"
        )
    return None


RULES: tuple[Rule, ...] = (_codec_time, _fsdp_weights, _text)
