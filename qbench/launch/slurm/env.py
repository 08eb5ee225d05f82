"""Inside a task that srun started: torch.distributed's ``env://`` variables from Slurm's.

The only part of the Slurm launcher that a rank loads (``qbench.run.worker`` calls
:func:`apply_worker_env` first thing), so it imports nothing but ``os`` and ``re``; the
package's ``__init__`` loads no other module until one of its names is used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list ("gpu[07-09,11],cpu1" -> "gpu07"), as the first line
    of ``scontrol show hostnames`` would give it, without running scontrol in every rank."""
    depth, head = 0, []
    for ch in nodelist.strip():
        if ch == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(ch, 0)
        head.append(ch)
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], "".join(head))


def tasks_per_node(value: str) -> list[int]:
    """Expand SLURM_TASKS_PER_NODE ("2(x3),1" -> [2, 2, 2, 1])."""
    out: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"cannot read tasks per node {value!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def default_port(job_id: str) -> int:
    """A port from the job id when the launcher chose none (same on every rank)."""
    return 20000 + int(job_id) % 20000 if job_id.isdigit() else 29500


def torch_env_from_slurm(env: Mapping[str, str]) -> dict[str, str]:
    """torch.distributed's env:// variables for a task started by srun, from its SLURM_* ones.

    RANK = SLURM_PROCID, WORLD_SIZE = the step's task count, LOCAL_RANK = SLURM_LOCALID,
    LOCAL_WORLD_SIZE = tasks on this node, GROUP_RANK = SLURM_NODEID; MASTER_ADDR = the first
    host of the step's node list (rank 0 runs there with srun's block distribution), or
    SLURM_LAUNCH_NODE_IPADDR without one; MASTER_PORT = the one the launcher exported, else
    derived from the job id. MASTER_ADDR / MASTER_PORT already set are kept.
    """
    if "SLURM_PROCID" not in env:
        raise ValueError("SLURM_PROCID is not set: not a task started by srun")
    world = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
    if not world:
        raise ValueError("neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is set")
    node = int(env.get("SLURM_NODEID", "0"))
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    counts = tasks_per_node(per_node) if per_node else []
    local_world = counts[node] if node < len(counts) else int(world)
    nodelist = (
        env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    )
    addr = env.get("MASTER_ADDR") or (
        first_host(nodelist) if nodelist else env.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1")
    )
    port = env.get("MASTER_PORT") or str(default_port(env.get("SLURM_JOB_ID", "")))
    return {
        "RANK": env["SLURM_PROCID"], "WORLD_SIZE": str(int(world)),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"), "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(node), "MASTER_ADDR": addr, "MASTER_PORT": port,
    }  # fmt: skip


def apply_worker_env(environ: MutableMapping[str, str] | None = None) -> bool:
    """At the start of a worker: when srun started it (SLURM_PROCID set) and no launcher set
    RANK (torchrun does) nor started it as an MPI rank (mpirun in a batch job passes on the
    batch step's SLURM_PROCID=0 to every rank), set the env:// variables. True if it did."""
    env = os.environ if environ is None else environ
    if "SLURM_PROCID" not in env or "RANK" in env or "OMPI_COMM_WORLD_RANK" in env:
        return False
    env.update(torch_env_from_slurm(env))
    return True
