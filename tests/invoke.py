"""``qbench ARGS`` run in this process, as the console script runs it: its exit code, its
stdout and its stderr, as a ``subprocess.CompletedProcess``.

Tests whose subject is what a command prints and the code it exits with used to start it as a
process (``python -m qbench.cli``); each paid a new interpreter and the imports of qbench and
what it uses (pandas, torch): 1 s of CPU for a usage error, 4-5 s for a command that imports
torch, on the 2-core machine the suite runs on, for output that is the same in this process.
The command's own start as a process (``python -m qbench.cli``, as the console script starts
``qbench.cli.main``; what a terminal shows when it fails) stays tested by the subprocess tests
in tests/cli/test_cli.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import click.formatting
from click.testing import CliRunner

from qbench.cli import main
from qbench.run.rank_server import exit_status


def qbench(
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str | None] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``qbench ARGS`` in this process: ``main()`` reads ``sys.argv`` as the console script's
    does, with stdin holding ``input``, the variables of ``env`` set over this process's
    environment (None: unset) and ``cwd`` as the current directory; all are restored after, and
    ``sys.path`` too (importing a user's factory module appends the current directory to it).
    A ``SystemExit`` gives the exit code (``sys.exit("text")`` is 1, as for a process); any
    other exception escapes ``main`` and fails the test with its traceback.

    ``PYTEST_CURRENT_TEST`` is unset meanwhile, as in tests/test_scenarios_quick.py: a rank
    server serves only sweeps that give their ranks the environment it was started with."""
    argv = ["qbench", *args]
    saved_argv, saved_path = sys.argv, sys.path[:]
    saved_cwd = os.getcwd()
    test_name = os.environ.pop("PYTEST_CURRENT_TEST", None)
    code = 0
    try:
        with CliRunner().isolation(input=input, env=env) as (out, err, _):
            # The width click wraps help to, worked out as for the console script (the
            # isolation forces 80 columns; a process whose stdout is a pipe gets 78).
            click.formatting.FORCED_WIDTH = None  # the isolation restores its old value
            sys.argv = argv
            if cwd is not None:
                os.chdir(cwd)
            try:
                main()
            except SystemExit as e:
                code = exit_status(e.code)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            stdout = out.getvalue().decode()
            stderr = err.getvalue().decode()
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path  # a user's factory module puts its directory on it
        os.chdir(saved_cwd)
        if test_name is not None:
            os.environ["PYTEST_CURRENT_TEST"] = test_name
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


PROCESS = [sys.executable, "-m", "qbench.cli"]
"""The argv prefix of ``python -m qbench.cli``, which :func:`run` runs in this process."""


def run(
    argv: list[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = False,
    **_ignored: object,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(PROCESS + ARGS, ...)`` in this process, for the multi-process tests
    whose subject is what a sweep launches and records, not the driver's own start: the
    driver's imports (4-5 s of CPU) are paid once per test worker, and its rank server
    serves every sweep whose ranks get the same environment. ``env``, a whole environment as
    ``subprocess.run`` takes it, is applied as the differences from this one's; output
    options and ``timeout`` are accepted and ignored (text output, the test's own timeout)."""
    if argv[: len(PROCESS)] != PROCESS:
        raise ValueError(f"not a qbench command: {argv}")
    overlay: dict[str, str | None] | None = None
    if env is not None:
        overlay = {k: v for k, v in env.items() if os.environ.get(k) != v}
        overlay.update({k: None for k in os.environ if k not in env})
    done = qbench(*argv[len(PROCESS) :], cwd=cwd, env=overlay)
    if check and done.returncode:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done
