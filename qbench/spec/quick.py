"""A scenario at the smallest scale that still runs every configuration end to end.

``qbench sweep --quick`` (and ``make figures QUICK=1``, and the test that runs every shipped
scenario) keeps a covering subset of the scenario's configurations (``cover: true``: every
model, dataset, scheme with each of its compressors, backend, world size and link in at least
one run, not the cross product), so each is started, trained, recorded and reported, but only
long enough to prove it works: the first seed, one repeat, at most ``BATCH`` samples per rank
and step, and in accuracy mode one epoch of ``STEPS_PER_EPOCH`` steps (evaluation included),
else ``WARMUP`` + ``ITERATIONS`` iterations; ``WARMUP`` rows are marked warm-up in both modes,
so every run has rows to summarise.
A scenario that cannot run on a fresh machine fails here in seconds instead of in a user's
afternoon. The numbers it measures mean nothing: keep its results apart (``--out``).
"""

from __future__ import annotations

from typing import Any

import yaml

from qbench.spec import scenario

WARMUP = 1
ITERATIONS = 2
STEPS_PER_EPOCH = 2
BATCH = 4
"""Per-rank batch cap: the big models' steps (vgg16-cifar at batch 16: 0.8 s a rank on the
2-core machine) were most of their quick sweeps; 4 keeps batch norm's statistics defined."""


def overrides(sc: scenario.Scenario) -> dict[str, Any]:
    """The top-level keys --quick replaces, for a validated scenario."""
    keys: dict[str, Any] = {"seed": sc.seed[0], "repeats": 1, "warmup": WARMUP, "cover": True}
    batch = sc.batch_size
    if isinstance(batch, int) and batch > BATCH:
        keys["batch_size"] = BATCH
    elif isinstance(batch, dict) and max(batch.values()) > BATCH:
        keys["batch_size"] = {w: min(b, BATCH) for w, b in batch.items()}
    if sc.epochs:  # warm-up marks rows only: a few are left to measure
        keys.update(epochs=1, steps_per_epoch=STEPS_PER_EPOCH)
    else:
        keys["iterations"] = ITERATIONS
    return keys


def quick(text: str, source: str) -> str:
    """Scenario text at the quick scale (checked first: a bad scenario fails as usual)."""
    sc = scenario.loads(text, source)
    raw = yaml.safe_load(text)
    keys = overrides(sc)
    raw.update(keys)
    note = f"# {source} with --quick ({', '.join(f'{k}={v}' for k, v in keys.items())})\n"
    return note + yaml.safe_dump(raw, sort_keys=False)
