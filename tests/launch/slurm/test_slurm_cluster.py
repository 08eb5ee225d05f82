"""tests/slurm_cluster.py skips only for a missing prerequisite, and fails on anything else.

The Slurm tests skip where Slurm is not installed; a real start-up error must not hide among
those skips. Here fake daemons (small shell scripts in place of munged, slurmctld and slurmd,
so no Slurm is needed) run under the real supervisor: one that exits at start-up fails the
cluster naming it and its output, as do nodes that never come up; binaries absent, or for
emulated nodes no root / ip / tc (a UserError), skip; another error in that check propagates.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from qbench.errors import UserError
from tests import slurm_cluster

# munged makes its socket (the supervisor waits for it) and runs on, as the real one does
MUNGED = """#!/bin/sh
for a in "$@"; do case "$a" in --socket=*) : > "${a#--socket=}";; esac; done
exec sleep 60
"""
RUNS = "#!/bin/sh\nexec sleep 60\n"
PLANTED = (
    "#!/bin/sh\necho 'slurmctld: fatal: planted start-up error: cannot bind port' >&2\nexit 3\n"
)


def _fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurmctld: str) -> None:
    """Every daemon and client ``binary`` finds is a script of tmp_path."""
    scripts = {"munged": MUNGED, "slurmctld": slurmctld, "slurmd": RUNS}
    for name in (*slurm_cluster.DAEMONS, *slurm_cluster.CLIENTS):
        path = tmp_path / name
        path.write_text(scripts.get(name, "#!/bin/sh\nexit 0\n"))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(slurm_cluster, "binary", lambda name: str(tmp_path / name))


def _outcome(start: Any) -> BaseException:
    """What starting a cluster raised (pytest's skip and fail are BaseExceptions)."""
    with pytest.raises(BaseException) as info, start():
        pass
    return info.value


def test_a_daemon_that_exits_at_start_up_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fakes(tmp_path, monkeypatch, slurmctld=PLANTED)
    got = _outcome(slurm_cluster.running_cluster)
    assert isinstance(got, pytest.fail.Exception), f"must fail, not {type(got).__name__}: {got}"
    message = str(got)
    assert message.startswith("slurm daemons did not start: the supervisor stopped them (exit ")
    assert "slurmctld exited with code 3" in message  # the supervisor names the daemon
    assert "planted start-up error: cannot bind port" in message  # and its own words


def test_nodes_that_never_come_up_fail_after_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fakes(tmp_path, monkeypatch, slurmctld=RUNS)  # all run; sinfo never says idle
    monkeypatch.setattr(slurm_cluster, "START_TIMEOUT_S", 1.0)
    got = _outcome(slurm_cluster.running_cluster)
    assert isinstance(got, pytest.fail.Exception), f"must fail, not {type(got).__name__}: {got}"
    assert str(got).startswith("slurm daemons did not start: the nodes were not idle after 1 s")


def test_slurm_not_installed_skips_saying_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fakes(tmp_path, monkeypatch, slurmctld=RUNS)
    monkeypatch.setattr(
        slurm_cluster, "binary", lambda name: None if name == "slurmd" else str(tmp_path / name)
    )
    got = _outcome(slurm_cluster.running_cluster)
    assert isinstance(got, pytest.skip.Exception), f"must skip, not {type(got).__name__}: {got}"
    assert str(got) == "slurm-wlm not installed: run `make slurm` (missing slurmd)"


def test_emulated_nodes_skip_without_namespaces_and_fail_on_any_other_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qbench.launch import netns

    _fakes(tmp_path, monkeypatch, slurmctld=RUNS)

    def not_root() -> None:
        raise UserError("network.bandwidth needs root (network namespaces and tc)")

    monkeypatch.setattr(netns, "check_available", not_root)
    got = _outcome(lambda: slurm_cluster.running_nodes_cluster(2))
    assert isinstance(got, pytest.skip.Exception), f"must skip, not {type(got).__name__}: {got}"
    assert "needs root" in str(got)

    def broken() -> None:
        raise RuntimeError("planted: a bug in the check itself")

    monkeypatch.setattr(netns, "check_available", broken)
    got = _outcome(lambda: slurm_cluster.running_nodes_cluster(2))
    assert isinstance(got, RuntimeError), f"must propagate, not {type(got).__name__}: {got}"
