"""Value checks of scenario keys: one-line UserErrors naming the key, the bad value and a fix
(qbench.spec.scenario calls them; their messages are the scenario schema's rules)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qbench.errors import UserError, did_you_mean
from qbench.spec import codec_times

# Keys an include / exclude entry may match on (values: one value or a list of values).
FILTER_KEYS = (
    "model", "dataset", "world_size", "nodes", "backend", "device", "scheme", "compressor",
    "network", "seed", "repeat", "skew", "compute",
)  # fmt: skip
LR_SCHEDULE_KEYS = ("milestones", "every", "gamma")


class EmptyMatrix(UserError):
    """No combination of the scenario can run; ``excluded`` (``matrix.Excluded``) says why
    each cannot, for ``--dry-run`` to print."""

    def __init__(self, name: str, excluded: list[Any]) -> None:
        self.excluded = excluded
        first = f", e.g. {excluded[0].description}: {excluded[0].reason}" if excluded else ""
        super().__init__(
            f"scenario {name!r} expands to no runnable combination: every one of its "
            f"{len(excluded)} is excluded{first}; `qbench sweep SCENARIO --dry-run` lists every "
            "reason"
        )


def check_name(name: str) -> None:
    if not name or any(c in name for c in "/\\ \t") or name.startswith("."):
        raise UserError(f"name {name!r} must be a plain directory name; e.g. `name: smoke`")


def check_choices(key: str, values: tuple[str, ...], valid: tuple[str, ...]) -> None:
    for v in values:
        if v not in valid:
            raise UserError(
                f"{key} {v!r} is not one of {', '.join(valid)}; e.g. `{key}: {valid[0]}`"
            )


def show(v: Any, limit: int = 40) -> str:
    """repr() for error messages, short even for a 5000-digit integer."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:
        return f"{'-' if v < 0 else ''}an integer of {v.bit_length()} bits"
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_positive(key: str, values: tuple[int, ...], example: str, hi: int = 1 << 20) -> None:
    for v in values:
        if v < 1:
            raise UserError(f"{key} must be >= 1, got {show(v)}; e.g. `{example}`")
        if v > hi:
            raise UserError(f"{key} must be at most {hi}, got {show(v)}; e.g. `{example}`")


def check_range(key: str, v: float, lo: float, hi: float, example: str = "") -> None:
    if not lo <= v <= hi:
        fix = f"; e.g. `{example}`" if example else ""
        raise UserError(f"{key} must be in [{lo:g}, {hi:g}], got {show(v)}{fix}")


def check_accuracy_mode(
    *,
    skew: Sequence[float],
    weight_decay: float,
    target_accuracy: float | None,
    lr_schedule: dict[str, Any],
    epochs: int | None,
    dataset: Sequence[object],
) -> None:
    """The scenario's accuracy-mode keys (keyword arguments, so this module needs no Scenario)."""
    for s in skew:
        check_range("skew", s, 0.0, 1.0, example="skew: [0, 0.8]")
    check_range("weight_decay", weight_decay, 0.0, 1e3, example="weight_decay: 0.0001")
    if target_accuracy is not None:
        check_range("target_accuracy", target_accuracy, 0.0, 1.0, example="target_accuracy: 0.8")
    check_lr_schedule(lr_schedule)
    if epochs is None:
        return
    check_range("epochs", epochs, 1, 10**5, example="epochs: 10")
    if "synthetic" in dataset:
        raise UserError(
            "epochs needs a dataset with a train/test split, got dataset synthetic; e.g. "
            "`dataset: digits` (bundled) or `dataset: fashion-mnist` (make data)"
        )


def check_weights(weights: dict[str, Any]) -> None:
    for k in weights:
        if k != "bits":
            raise UserError(
                f"weights: unknown key {show(k)}; valid: bits; e.g. `weights: [none, {{bits: 8}}]`"
            )
    bits = weights.get("bits", 32)
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 32:
        raise UserError(
            f"weights.bits must be a whole number in [2, 32], got {show(bits)}; "
            "e.g. `weights: {bits: 8}`"
        )


def check_lr_schedule(sched: dict[str, Any]) -> None:
    ex = "e.g. `lr_schedule: {milestones: [30, 45], gamma: 0.1}`"
    for k in sched:
        if k not in LR_SCHEDULE_KEYS:
            raise UserError(
                f"lr_schedule: unknown key {show(k)}; valid: {', '.join(LR_SCHEDULE_KEYS)}; {ex}"
            )
    if "milestones" in sched and "every" in sched:
        raise UserError(f"lr_schedule takes milestones or every, not both; {ex}")
    gamma = sched.get("gamma", 0.1)
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0 < gamma <= 1:
        raise UserError(f"lr_schedule.gamma must be in (0, 1], got {show(gamma)}; {ex}")
    ms = sched.get("milestones", [])
    if not isinstance(ms, list) or not all(
        isinstance(m, int) and not isinstance(m, bool) and 1 <= m <= 10**5 for m in ms
    ):
        raise UserError(
            f"lr_schedule.milestones must be a list of epochs >= 1, got {show(ms)}; {ex}"
        )
    every = sched.get("every", 1)
    if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= 10**5:
        raise UserError(
            f"lr_schedule.every must be a whole number of epochs >= 1, got {show(every)}; {ex}"
        )


def check_filter(key: str, entry: dict[str, Any]) -> None:
    if not entry:
        raise UserError(
            f"{key} has an empty entry; give axes to match, e.g. `{key}: [{{backend: mpi}}]`"
        )
    for k in entry:
        if k not in FILTER_KEYS:
            hint = did_you_mean(k, list(FILTER_KEYS))
            raise UserError(
                f"{key} entry matches on unknown axis {k!r}{hint}; valid: {', '.join(FILTER_KEYS)}"
            )


def check_batch(batch: int | dict[int, int], world_sizes: tuple[int, ...]) -> None:
    sizes = batch.values() if isinstance(batch, dict) else [batch]
    for b in sizes:
        if b < 1:
            raise UserError(f"batch_size must be >= 1, got {b}; e.g. `batch_size: 32`")
    if isinstance(batch, dict):
        missing = [w for w in world_sizes if w not in batch]
        if missing:
            raise UserError(
                f"batch_size map has no entry for world_size {missing[0]}; "
                f"add `{missing[0]}: <per-rank batch>` or give one number"
            )


def check_codec_time(path: str, replayed: bool) -> None:
    """``codec_time:``: only with ``compute: replay``, and a ``qbench bench kernels --json``
    file (which compressors it covers is checked per run, ``qbench.spec.matrix``)."""
    if not replayed:
        raise UserError(
            f"codec_time: {path} replays codec time beside replayed compute; add "
            "`compute: replay`, or drop `codec_time:`"
        )
    codec_times.CodecTimes.read(path)


TIMELINE_KEYS = ("forward_s", "backward_s", "step_s", "params")


def check_timeline(path: str, replayed: bool) -> None:
    """``timeline:``: only with ``compute: replay``, and a readable replay timeline
    (``qbench.run.replay.Timeline`` as JSON, e.g. a replayed run's ``timeline.json``)."""
    if not replayed:
        raise UserError(
            f"timeline: {path} is what replayed compute sleeps through; add `compute: replay`, "
            "or drop `timeline:`"
        )
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UserError(
            f"timeline: {path} cannot be read as a replay timeline ({type(e).__name__}); give "
            "a replayed run's timeline.json"
        ) from None
    missing = [k for k in TIMELINE_KEYS if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise UserError(
            f"timeline: {path} has no {', '.join(missing)}; give a replayed run's timeline.json"
        )
