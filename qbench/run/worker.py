"""Per-rank entry point: ``python -m qbench.run.worker RUN_DIR/spec.json`` (torchrun, mpirun,
srun or the driver's own rank groups), or ``... OUT/.groups/<launch>/plan.json`` for a warm rank
group (``qbench.run.group``). The process only: one run's lifecycle is ``qbench.run.lifecycle``,
the training loops ``qbench.run.loops.flat`` and ``qbench.run.loops.ddp``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from qbench import comm
from qbench.launch.slurm.env import apply_worker_env
from qbench.records.store import is_group_plan
from qbench.run import group, lifecycle
from qbench.spec.runspec import RunSpec


def main(argv: list[str] | None = None) -> int:
    apply_worker_env()  # a rank started by srun: torch env:// variables from SLURM_* (else no-op)
    args = sys.argv[1:] if argv is None else argv
    try:
        return _main(args)
    except Exception as e:  # outside a run (joining the group, say): run_config tags its own
        lifecycle.tag_failure(_launcher_rank(), e)
        raise


# Where each launcher puts a rank's number before the communicator exists: torchrun, qbench's
# own rank groups and srun (through apply_worker_env): RANK; mpirun: the rest (MPICH: PMI_RANK).
_RANK_VARS = ("RANK", *comm.MPI_RANK_VARS, "PMI_RANK")


def _launcher_rank() -> str:
    return next((os.environ[v] for v in _RANK_VARS if v in os.environ), "?")


def _main(args: list[str]) -> int:
    if is_group_plan(Path(args[0])):  # a warm rank group: many runs, one launch
        return group.main(Path(args[0]))
    spec_path = Path(args[0])
    spec = RunSpec.from_dict(json.loads(spec_path.read_text()))
    cm = lifecycle.connect(spec, spec.measurement.timeout)
    ok = lifecycle.run_config(spec, spec_path, cm, lifecycle.fault_injection(cm.rank, spec.run_id))
    if not ok:
        cm.abort(1)  # peers may be blocked in a collective: end the whole job now
    cm.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
