"""Every command README.md and docs/ show still parses, and the quick ones run.

Commands are read from the shell code blocks: each ``qbench ...`` (or ``.venv/bin/qbench``) is
parsed by the real command line (unknown commands and options fail here); ``--dry-run``,
``--help``, ``models`` and ``info`` are run for real and must exit 0. Scripts and files the
blocks name (``benchmarks/*.py``, ``scenarios/*.yaml``) must exist, and ``make`` targets must be
in the Makefile.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import click
import pytest

from qbench.cli import cli
from tests.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = ("", "sh", "bash", "console", "shell")


def _blocks(text: str) -> list[str]:
    """The shell code blocks of a markdown text (fences paired line by line)."""
    blocks, current, lang = [], None, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if current is None:
                current, lang = [], line.strip().strip("`").strip()
            else:
                if lang in SHELL:
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


QUICK = ("--dry-run", "--help", "-h")


def _commands() -> list[tuple[str, list[str]]]:
    found = []
    for doc in DOCS:
        for block in _blocks(doc.read_text()):
            text = block.replace("\\\n", " ")
            for line in text.splitlines():
                line = line.split(" #", 1)[0].strip().removeprefix("$ ")
                for part in re.split(r"\s*(?:&&|;|\|)\s*", line):
                    argv = _argv(part)
                    if argv is not None:
                        found.append((f"{doc.relative_to(ROOT)}: {part}", argv))
    return found


def _argv(part: str) -> list[str] | None:
    """The arguments after ``qbench`` (None: not a qbench command, or a synopsis line)."""
    try:
        words = shlex.split(part)
    except ValueError:
        return None
    words = [w for w in words if "=" not in w or not w.split("=")[0].isupper()]  # VAR=x prefix
    if len(words) < 2 or Path(words[0]).name != "qbench" or words[1] not in cli.lazy:
        return None  # not a qbench command (prose in a plain block mentions "qbench ...")
    if any(ch in part for ch in "[]|…") or "..." in part or any(w.isupper() for w in words):
        return None  # a synopsis (`qbench sweep [SCENARIO.yaml] ...`), not a command to run
    return words[1:]


COMMANDS = _commands()


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) > 20


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_command_parses(where: str, argv: list[str]) -> None:
    command: click.Command = cli
    ctx = None
    rest = list(argv)
    while True:
        ctx = command.make_context("qbench", list(rest), parent=ctx)
        with warnings.catch_warnings():  # click 8.2 renames protected_args; 8.1 has only it
            warnings.simplefilter("ignore", DeprecationWarning)
            pending = [*ctx.protected_args, *ctx.args]
        if not isinstance(command, click.Group) or not pending:
            break
        name, *rest = pending
        sub = command.get_command(ctx, name)
        assert sub is not None, f"{where}: no command {name!r}"
        command = sub


@pytest.mark.parametrize(
    ("where", "argv"),
    [(w, a) for w, a in COMMANDS if set(a) & set(QUICK) or a[:1] in (["models"], ["info"])],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_quick_command_runs(where: str, argv: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "qbench.cli", *argv], capture_output=True, text=True,
        cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"{where}: {proc.stderr[-500:]}"


def test_named_files_and_make_targets_exist() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    for doc in DOCS:
        for block in _blocks(doc.read_text()):
            for path in re.findall(r"\b((?:benchmarks|scenarios)/[\w./-]+\.(?:py|yaml))", block):
                assert (ROOT / path).exists(), f"{doc.name}: {path} does not exist"
            for target in re.findall(r"^\s*make ([a-z][\w-]*)", block, re.M):
                assert target in targets, f"{doc.name}: no make target {target!r}"
