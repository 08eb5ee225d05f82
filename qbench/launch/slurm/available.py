"""Whether Slurm can run jobs from here: its tools on PATH and a controller that ``sinfo``
reaches. ``qbench sweep --launcher slurm`` checks before the first run; ``qbench info`` shows
the same check as one line."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from qbench.errors import UserError

TOOLS = ("sbatch", "srun", "scancel", "squeue", "sinfo")


def _missing_tool(tools: Sequence[str] = TOOLS) -> str | None:
    for tool in tools:
        if shutil.which(tool) is None:
            return tool
    return None


def _sinfo() -> tuple[bool, str]:
    """(reachable, nodes by state or the reason) from sinfo."""
    try:
        p = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format", "%N %t"],
            capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"sinfo failed: {e}"
    if p.returncode != 0:
        lines = (p.stderr or p.stdout).strip().splitlines()
        return False, f"sinfo: {lines[-1] if lines else f'exit code {p.returncode}'}"
    states: dict[str, str] = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1].rstrip("*~#!%$@^-")
    if not states:
        return True, "no nodes"
    count: dict[str, int] = {}
    for s in states.values():
        count[s] = count.get(s, 0) + 1
    return True, ", ".join(f"{n} node{'s' if n > 1 else ''} {s}" for s, n in sorted(count.items()))


def check_available() -> None:
    """Fail before any run starts when Slurm cannot run jobs from here."""
    missing = _missing_tool()
    if missing:
        raise UserError(
            f"launcher slurm: {missing} not found; install Slurm (Debian: `make slurm`) or use "
            "--launcher local"
        )
    ok, what = _sinfo()
    if not ok:
        raise UserError(
            f"launcher slurm: cannot reach the Slurm controller ({what}); start slurmctld, "
            "point SLURM_CONF at the cluster's slurm.conf, or use --launcher local"
        )


def describe() -> str:
    """One line for ``qbench info``."""
    missing = _missing_tool()
    if missing:
        return f"slurm: not available ({missing} not found; install Slurm or use --launcher local)"
    ok, what = _sinfo()
    return f"slurm: available (sinfo: {what})" if ok else f"slurm: not available ({what})"
