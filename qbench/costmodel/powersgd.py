"""PowerSGD's local work, fitted from its runs: what the collectives alone do not explain.

torch's PowerSGD hook multiplies each bucket's matrices by P and Q, orthogonalises P and
decompresses, besides its two allreduces (``qbench.costmodel.overlap``). That work depends on
the matrices' shapes, the rank and the device, and on CPU ranks it competes with backward for
the cores, so it is measured rather than derived: for each PowerSGD run in the fit, the
measured iteration minus the model's prediction without local work (the collectives of its
measured payloads on that run's link, the workload's DDP bucket profile); the median over runs
per workload and PowerSGD label is stored on the bucket profile (``BucketProfile.local_s``) and
added to the exposed communication of every prediction, scaled with the CPU share like compute.
Runs on other links than the fitted ones are then predictions, which ``qbench cost validate``
scores.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from qbench.costmodel import overlap
from qbench.costmodel.fit.points import run_config
from qbench.costmodel.inputs import compressor_name
from qbench.costmodel.model import BucketProfile, CostModel
from qbench.costmodel.schemes import POWERSGD
from qbench.errors import UserError


def fit_local_work(model: CostModel, runs: pd.DataFrame) -> list[str]:
    """Set ``local_s`` on the profiles from the PowerSGD runs in ``runs``; notes for runs that
    could not be used."""
    excess: dict[tuple[int, str], list[float]] = defaultdict(list)
    notes: list[str] = []
    for r in runs.itertuples(index=False):
        if compressor_name(r) != POWERSGD:
            continue
        got = run_config(r, model)
        if got is None:
            continue
        scheme, cfg = got
        try:
            prof, _ = overlap.bucket_profile(model, cfg, scheme)
            without = overlap.predict_backward(model, cfg, scheme, local=False)
        except UserError as e:
            notes.append(f"{r.run_id}: PowerSGD local work not fitted ({e})")
            continue
        share = overlap.cpu_share(cfg.world_size, cfg.host_cores)
        lag = (float(r.t_iteration) - without.total_s) / share
        excess[(id(prof), cfg.compressor.label)].append(lag)
    by_id: dict[int, BucketProfile] = {id(p): p for p in model.buckets}
    for (pid, label), values in excess.items():
        by_id[pid].local_s[label] = max(0.0, float(np.median(values)))
    return notes
