"""Mutation testing of qbench's pure core, one module group at a time (`make mutation`).

setup.cfg holds the configuration: ``[mutmut]`` the settings every run shares, and one
``[mutmut:NAME]`` section per group with ``only_mutate`` (the files whose mutants count) and
``tests`` (the fast test files, or node ids, that must kill them), and optionally ``env``
(VAR=value lines for the tests' environment). Each group runs in its own
directory, build/mutation/NAME/, holding links to qbench/ and tests/ and a setup.cfg whose
``[mutmut]`` section is the shared one plus the group's files and tests, so that mutmut's
``stats`` run, which finds the tests covering each mutated function, runs only the group's
tests. Then mutmut runs each mutant against the tests that cover its function, and a second
pass runs each survivor against every test of the files that cover its function (``widen``),
and each timeout once more.

The score of a module is killed / (killed + survived + no tests + suspicious), timeouts counted
as killed (the tests run with one OpenMP thread: a pool does not survive mutmut's fork, and its
hangs would pass for kills). Mutants listed in tests/mutation_equivalent.txt (names or fnmatch
patterns) are left out of it, each with its reason: equivalent (no input tells it apart), or
unreachable here ("GPU only": only a CUDA tensor tells it apart; "native only": only the
compiled kernels run it, and the group forces the torch reference; "import time": the code runs
only while the module loads, before mutmut forks the process that activates a mutant). A
group's survivors and their diffs go to build/mutation/NAME/survivors.txt.

    python tests/mutation.py                        # every group
    python tests/mutation.py costmodel bitpack      # some
    python tests/mutation.py --survivors bitpack    # rerun the last run's survivors only
    python tests/mutation.py --list                 # the groups, their files and tests
    python tests/mutation.py --keep --sample 300 spec  # 300 more of the mutants not yet run

``--sample N`` runs N of the mutants that have no verdict yet, drawn at random (seed 0) from
every file of the group, for a group too slow to run whole here; the table's "not run" column
says how many of each file's mutants the score does not rest on.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "mutation"
EQUIVALENT = ROOT / "tests" / "mutation_equivalent.txt"
PREFIX = "mutmut:"
# what a group's directory links to (setup.cfg's also_copy names what mutmut copies of it)
LINKED = (
    *("qbench", "tests", "pyproject.toml", "README.md"),
    *("benchmarks", "scenarios", "docs", "kernels", ".github"),
)

# mutmut's exit codes per mutant (mutmut.stats.status_by_exit_code), grouped for the score.
TIMEOUTS = {36, -24, 24, 152, 255}
KILLED = {1, 3, *TIMEOUTS}  # failing tests, or a timeout (rerun once in the second pass)
SURVIVED = {0}
NO_TESTS = {5, 33}
NOT_RUN = {None, 2, 34, 37}  # not checked, interrupted, skipped, type check
UNREACHABLE = ("GPU only", "import time", "native only")
"""Reasons that mark a mutant no test here can activate (rather than an equivalent one)."""


@dataclass
class Tally:
    killed: int = 0
    survived: int = 0
    no_tests: int = 0
    suspicious: int = 0
    equivalent: int = 0
    unreachable: int = 0
    not_run: int = 0
    survivors: list[str] = field(default_factory=list)
    timeouts: list[str] = field(default_factory=list)

    @property
    def counted(self) -> int:
        return self.killed + self.survived + self.no_tests + self.suspicious

    @property
    def score(self) -> float:
        return 100.0 * self.killed / self.counted if self.counted else float("nan")


def _config() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg")
    return cfg


def groups(cfg: configparser.ConfigParser) -> dict[str, configparser.SectionProxy]:
    return {s[len(PREFIX) :]: cfg[s] for s in cfg.sections() if s.startswith(PREFIX)}


def _lines(value: str) -> list[str]:
    return [v.strip() for v in value.splitlines() if v.strip()]


def equivalent() -> dict[str, str]:
    """Mutant name (or fnmatch pattern) -> the reason, from tests/mutation_equivalent.txt."""
    out = {}
    for line in EQUIVALENT.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            out[name] = why.strip()
    return out


def reason(mutant: str, skip: dict[str, str]) -> str | None:
    if mutant in skip:
        return skip[mutant]
    return next((why for pattern, why in skip.items() if fnmatch(mutant, pattern)), None)


def prepare(name: str, cfg: configparser.ConfigParser, *, fresh: bool) -> Path:
    """build/mutation/NAME with links to the sources and the group's setup.cfg."""
    work = BUILD / name
    if fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    for entry in LINKED:
        link = work / entry
        if not link.is_symlink():
            link.symlink_to(ROOT / entry)
    group = groups(cfg)[name]
    out = configparser.ConfigParser(interpolation=None)
    for section in cfg.sections():
        if not section.startswith(PREFIX):
            out[section] = dict(cfg[section])
    out["mutmut"]["only_mutate"] = group["only_mutate"]
    out["mutmut"]["pytest_add_cli_args_test_selection"] = group["tests"]
    with open(work / "setup.cfg", "w") as f:
        out.write(f)
    return work


def run(
    name: str, work: Path, group: configparser.SectionProxy, max_children: int, only: list[str]
) -> None:
    env = dict(os.environ, QBENCH_KERNELS=str(ROOT / "kernels"))
    # mutmut forks one child per mutant from a process that imported torch: an OpenMP pool
    # does not survive a fork (the child waits forever on a futex, and mutmut counts the hang
    # as a timeout, i.e. a kill), so every thread pool gets one thread
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.update(line.split("=", 1) for line in _lines(group.get("env", "")))
    mutmut = Path(sys.executable).with_name("mutmut")
    argv = [str(mutmut), "run", "--max-children", str(max_children), *only]
    shown = " ".join(argv[1:4]) + (f" <{len(only)} named mutants>" if only else "")
    print(f"== {name}: {shown} in {work.relative_to(ROOT)}", flush=True)
    with open(work / "mutmut.log", "w") as log:
        done = subprocess.run(argv, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = (work / "mutmut.log").read_text()[-3000:]
        raise SystemExit(f"mutation {name}: mutmut exited {done.returncode}\n{tail}")


def widen(work: Path) -> None:
    """Let every test of a test file that covers a function run against its mutants.

    mutmut maps each function to the tests during which it ran; work done once in a
    module-scoped fixture is charged to the first test that requested it, so the other tests
    that assert on the fixture's result never run against the mutant. The second pass
    corrects that: a function covered by any test of a file is checked by all of them.
    """
    path = work / "mutants" / "mutmut-stats.json"
    stats = json.loads(path.read_text())
    by_file: dict[str, set[str]] = {}
    for test in stats["duration_by_test"]:
        by_file.setdefault(test.split("::")[0], set()).add(test)
    for function, tests in stats["tests_by_mangled_function_name"].items():
        files = {t.split("::")[0] for t in tests}
        wide = set(tests).union(*(by_file.get(f, set()) for f in files))
        stats["tests_by_mangled_function_name"][function] = sorted(wide)
    path.write_text(json.dumps(stats, indent=4))


def tally(work: Path, group: configparser.SectionProxy, skip: dict[str, str]) -> dict[str, Tally]:
    """Per mutated file: mutmut's verdicts, read from mutants/<file>.meta."""
    out = {}
    for pattern in _lines(group["only_mutate"]):
        for meta in sorted((work / "mutants").glob(pattern + ".meta")):
            t = Tally()
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            for mutant, code in sorted(codes.items()):
                why = reason(mutant, skip)
                if why is not None and why.startswith(UNREACHABLE):
                    t.unreachable += 1
                elif why is not None:
                    t.equivalent += 1
                elif code in KILLED:
                    t.killed += 1
                    if code in TIMEOUTS:
                        t.timeouts.append(mutant)
                elif code in SURVIVED:
                    t.survived += 1
                    t.survivors.append(mutant)
                elif code in NO_TESTS:
                    t.no_tests += 1
                    t.survivors.append(mutant)
                elif code in NOT_RUN:
                    t.not_run += 1
                else:
                    t.suspicious += 1
                    t.survivors.append(mutant)
            out[str(meta.relative_to(work / "mutants"))[: -len(".meta")]] = t
    return out


def unrun(work: Path, group: configparser.SectionProxy, n: int) -> list[str]:
    """n mutants of the group's files that have no verdict yet, drawn at random (seed 0)."""
    pending = []
    for pattern in _lines(group["only_mutate"]):
        for meta in sorted((work / "mutants").glob(pattern + ".meta")):
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            pending += sorted(m for m, code in codes.items() if code is None)
    return sorted(random.Random(0).sample(pending, min(n, len(pending))))


def write_survivors(work: Path, tallies: dict[str, Tally]) -> None:
    mutmut = Path(sys.executable).with_name("mutmut")
    with open(work / "survivors.txt", "w") as f:
        for t in tallies.values():
            for mutant in t.survivors:
                shown = subprocess.run(
                    [str(mutmut), "show", mutant], cwd=work, capture_output=True, text=True
                )
                f.write(shown.stdout + "\n")


def table(rows: list[tuple[str, str, Tally]]) -> str:
    lines = [
        "| group | module | mutants | killed | survived | no tests | equivalent | unreachable "
        "| not run | score |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, path, t in rows:
        total = t.counted + t.equivalent + t.unreachable + t.not_run
        lines.append(
            f"| {name} | `{path}` | {total} | {t.killed} | {t.survived + t.suspicious} | "
            f"{t.no_tests} | {t.equivalent} | {t.unreachable} | {t.not_run} | {t.score:.1f} % |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="groups to run (default: all)")
    parser.add_argument("--max-children", type=int, default=1, help="mutmut worker processes")
    parser.add_argument("--keep", action="store_true", help="reuse earlier results")
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="only the second pass: rerun the last survivors (after adding tests)",
    )
    parser.add_argument(
        "--sample", type=int, metavar="N", help="run N of the mutants without a verdict yet"
    )
    parser.add_argument("--report-only", action="store_true", help="tally the last runs")
    parser.add_argument("--fail-under", type=float, default=85.0, help="minimum score (%%)")
    parser.add_argument("--list", action="store_true", help="list the groups and exit")
    args = parser.parse_args(argv)
    cfg = _config()
    known = groups(cfg)
    if args.list:
        for name, g in known.items():
            print(f"{name}: {' '.join(_lines(g['only_mutate']))}")
            print(f"    tests: {' '.join(_lines(g['tests']))}")
        return 0
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown group {unknown[0]!r}; valid: {', '.join(known)}")
    skip = equivalent()
    rows, low = [], []
    for name in args.names or list(known):
        work = BUILD / name
        if not args.report_only:
            start = time.monotonic()
            work = prepare(name, cfg, fresh=not (args.keep or args.survivors))
            if args.sample:
                sample = unrun(work, known[name], args.sample)
                if not sample:
                    raise SystemExit(f"mutation {name}: no mutant without a verdict to sample")
                run(name, work, known[name], args.max_children, sample)
            elif not args.survivors:
                run(name, work, known[name], args.max_children, [])
            # second pass: the survivors against every test of the files that cover them, and
            # the timeouts once more (a hang the mutant causes hangs again: still a kill)
            tallies = tally(work, known[name], skip).values()
            only = [m for t in tallies for m in (*t.survivors, *t.timeouts)]
            if only:
                widen(work)
                run(name, work, known[name], args.max_children, only)
            print(f"   {time.monotonic() - start:.0f} s", flush=True)
        tallies = tally(work, known[name], skip)
        write_survivors(work, tallies)
        for path, t in tallies.items():
            rows.append((name, path, t))
            if t.score < args.fail_under:
                low.append(f"{path} {t.score:.1f} %")
    print(table(rows))
    print(f"survivors and their diffs: {BUILD.relative_to(ROOT)}/<group>/survivors.txt")
    if low:
        print(f"below {args.fail_under:g} %: {', '.join(low)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
