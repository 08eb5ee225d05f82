"""A table of bad inputs as a new user makes them (files, options, specs, scenario values): each
is one line on stderr naming what is wrong, exit code 2, never a traceback (issue 21).

Cases run in-process through ``qbench.cli.main`` (fast); what a terminal shows of a real
process is tested in tests/cli/test_cli.py. Each case names a piece of text its message must
contain, so a case cannot pass by failing for another reason.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qbench.cli import main
from tests.invoke import qbench

OK = "name: x\nmodel: mlp\nworld_size: 2\n"
Case = tuple[Callable[[Path], list[str]], str]


def scenario(text: str | bytes, *options: str, name: str = "s.yaml") -> Callable[[Path], list[str]]:
    """``sweep FILE --dry-run OPTIONS`` with FILE holding ``text``."""

    def argv(tmp: Path) -> list[str]:
        path = tmp / name
        (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)  # type: ignore[operator]
        return ["sweep", str(path), "--dry-run", *options]

    return argv


def value(line: str, *options: str) -> Callable[[Path], list[str]]:
    """A valid scenario plus one line (a bad key or value)."""
    return scenario(OK + line + "\n", *options)


def command(*args: str) -> Callable[[Path], list[str]]:
    """A command line; ``{tmp}`` in an argument is the test's temporary folder."""
    return lambda tmp: [a.replace("{tmp}", str(tmp)) for a in args]


def special(kind: str) -> Callable[[Path], list[str]]:
    """Scenario paths that are not files: a directory, a FIFO, a broken link."""

    def argv(tmp: Path) -> list[str]:
        path = tmp / f"{kind}.yaml"
        if kind == "directory":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(tmp / "gone.yaml")
        return ["sweep", str(path)]

    return argv


CASES: dict[str, Case] = {
    # -- the scenario file itself
    "missing file": (command("sweep", "{tmp}/nope.yaml"), "not found"),
    "directory": (special("directory"), "is a directory"),
    "fifo": (special("fifo"), "is not a regular file"),
    "broken link": (special("broken"), "broken symbolic link"),
    "latin-1 text": (scenario("name: caf\xe9\nmodel: mlp\n".encode("latin-1")), "not UTF-8"),
    "utf-16 text": (scenario(OK.encode("utf-16")), "not UTF-8"),
    "binary file": (scenario(bytes(range(256))), "not UTF-8"),
    "png file": (scenario(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"), "not UTF-8"),
    "NUL in text": (scenario("name: x\0\nmodel: mlp\n"), "not valid YAML"),
    "empty file": (scenario(""), "must be a YAML mapping"),
    "bad YAML with --set": (scenario("name: x\nmodel: [mlp\n", "--set", "seed=1"),
                            "line 3 is not valid YAML"),
    "a list with --set": (scenario("- name: x\n", "--set", "seed=1"), "must be a YAML mapping"),
    "only a comment": (scenario("# nothing\n"), "must be a YAML mapping"),
    "a list": (scenario("- name: x\n"), "must be a YAML mapping"),
    "a string": (scenario("hello\n"), "must be a YAML mapping"),
    "bad indentation": (scenario("name: x\n model: mlp\n"), "not valid YAML"),
    "unclosed bracket": (scenario("name: x\nmodel: [mlp\n"), "not valid YAML"),
    "tab indentation": (scenario("name: x\nmodel:\n\t- mlp\n"), "not valid YAML"),
    "python tag": (scenario("name: !!python/object:os.system x\nmodel: mlp\n"), "not valid YAML"),
    "huge integer": (value("warmup: " + "9" * 5000), "YAML value cannot be read"),
    "deep nesting": (value("seed: " + "[" * 2000 + "]" * 2000), "nested too deeply"),
    # -- keys
    "unknown key": (value("modle: mlp"), "unknown key 'modle'"),
    "missing name": (scenario("model: mlp\n"), "missing required key 'name'"),
    "missing model": (scenario("name: x\n"), "missing required key 'model'"),
    "name with a slash": (scenario("name: a/b\nmodel: mlp\n"), "plain directory name"),
    "name a number": (scenario("name: 5\nmodel: mlp\n"), "name must be str"),
    # -- axis values
    "world_size zero": (value("world_size: 0"), "world_size must be >= 1"),
    "world_size text": (value("world_size: two"), "world_size must be int"),
    "world_size float": (value("world_size: 1.5"), "world_size must be int"),
    "world_size bool": (value("world_size: true"), "world_size must be int"),
    "world_size empty": (value("world_size: []"), "world_size is an empty list"),
    "world_size mixed": (value("world_size: [1, a]"), "world_size must be int"),
    "backend unknown": (value("backend: infiniband"), "backend 'infiniband'"),
    "device unknown": (value("device: tpu"), "device 'tpu'"),
    "compute unknown": (value("compute: fp8"), "compute 'fp8'"),
    "norm unknown": (value("norm: layernorm"), "norm 'layernorm'"),
    "model unknown": (value("model: alexnot"), "unknown model 'alexnot'"),
    "model nameless": (value("model: {params: 3}"), "has no name"),
    "model params junk": (value("model: {name: synthetic, params: lots}"), "params"),
    "dataset unknown": (value("dataset: imagenet22k"), "unknown dataset"),
    "batch zero": (value("batch_size: 0"), "batch_size must be >= 1"),
    "batch map gap": (value("batch_size: {1: 32}"), "no entry for world_size 2"),
    "seed negative": (value("seed: -1"), "seed must be in"),
    "seed huge": (value("seed: 1267650600228229401496703205376"), "seed must be in"),
    "skew nan": (value("skew: .nan"), "skew"),
    "lr infinite": (value("lr: .inf"), "lr must be in"),
    "momentum above 1": (value("momentum: 2"), "momentum must be in"),
    "iterations zero": (value("iterations: 0"), "iterations must be in"),
    "warmup negative": (value("warmup: -1"), "warmup must be in"),
    "repeats zero": (value("repeats: 0"), "repeats must be in"),
    "timeout zero": (value("timeout: 0"), "timeout must be in"),
    "target above 1": (value("target_accuracy: 2"), "target_accuracy must be in"),
    "epochs on synthetic": (value("epochs: 3"), "epochs needs a dataset"),
    "lr_schedule key": (value("lr_schedule: {every: 0}"), "lr_schedule.every"),
    "weights bits": (value("weights: {bits: 40}"), "weights.bits"),
    "weights key": (value("weights: [{width: 8}]"), "weights: unknown key"),
    "price negative": (value("price_per_hour: -1"), "price_per_hour must be in"),
    "telemetry word": (value("telemetry: yes please"), "telemetry must be bool"),
    "profile number": (value("profile: 3"), "profile must be bool"),
    "network junk": (value("network: {bandwidth: fast}"), "bandwidth"),
    "network a number": (value("network: 5"), "network"),
    "include a number": (value("include: 5"), "include entry 5 must be a mapping"),
    "exclude axis": (value("exclude: [{rank: 1}]"), "unknown axis 'rank'"),
    "exclude empty entry": (value("exclude: [{}]"), "empty entry"),
    "gpus_per_node zero": (value("gpus_per_node: 0"), "gpus_per_node must be in"),
    "nodes uneven": (value("world_size: 3\nnodes: 2\nlauncher: slurm"), "split evenly"),
    "launcher unknown": (value("launcher: kubernetes"), "launcher 'kubernetes'"),
    "slurm not a mapping": (value("slurm: gpu"), "slurm must be a mapping"),
    "layers junk": (value("layers: 5"), "layers"),
    # -- compressor and scheme entries: the file, the entry as written, the fix
    "compressor typo": (value("compressor: [none, {name: qsdg}]"), "entry 2 `{name: qsdg}`"),
    "compressor name hint": (value("compressor: qsdg"), "did you mean 'qsgd'?"),
    "compressor key typo": (
        value("compressor: [{name: qsgd, bucket: 512}]"), "did you mean 'bucket_size'?"),
    "compressor bad bits": (value("compressor: [{name: qsgd, bits: 12}]"), "bits must be 1..8"),
    "compressor bits text": (value("compressor: [{name: qsgd, bits: four}]"), "bits must be"),
    "compressor seed": (value("compressor: [{name: qsgd, seed: 1}]"), "remove `seed`"),
    "compressor seed, cli form": (value("compressor: ['qsgd:seed=1']"), "remove `seed`"),
    "compressor cli form bad": (value("compressor: ['qsgd:bits']"), "is not KEY=VALUE"),
    "compressor cli form no name": (value("compressor: [':bits=4']"), "has no name"),
    "compressor cli form yaml": (value("compressor: ['qsgd:bits=[4']"), "not a YAML value"),
    "compressor nameless": (value("compressor: [{bits: 4}]"), "has no name"),
    "compressor list name": (value("compressor: [{name: [qsgd]}]"), "unknown compressor"),
    "compressor int key": (value("compressor: [{name: qsgd, 1: 2}]"), "parameter names"),
    "compressor a number": (value("compressor: [5]"), "must be a name or a mapping"),
    "compressor rule": (value("compressor: [{name: qsgd, bits: 1, layout: sign}]"), "layout"),
    "topk ratio": (value("compressor: [{name: topk, ratio: 2}]"), "ratio must be in"),
    "scheme unknown": (value("scheme: ring-allreduce"), "unknown scheme 'ring-allreduce'"),
    "scheme param": (value("scheme: [{name: gossip, topology: star}]"), "entry 1"),
    "scheme cli form bad": (value("scheme: ['reduce-broadcast:overlap=0']"), "overlap"),
    "scheme gamma rule": (value("scheme: [{name: gossip, algorithm: dpsgd, gamma: 0.5}]"),
                          "gamma"),
    "scheme down junk": (value("scheme: [{name: parameter-server, down: {bits: 8}}]"), "down"),
    "scheme auto params": (value("scheme: [{name: auto, overlap: 4}]\ncompressor: none"),
                           "scheme auto is allreduce"),
    # -- combinations: nothing runnable (every reason is in --dry-run)
    "nothing runnable": (value("backend: mpi\nscheme: ddp"), "no runnable combination"),
    "nothing runnable, no dry run": (command("sweep", "{tmp}/none.yaml"), "not found"),
    "include matches nothing": (value("include: [{backend: mpi}]"), "no runnable combination"),
    # -- options
    "set without =": (value("", "--set", "seed"), "expected KEY=VALUE"),
    "set unknown key": (value("", "--set", "wrld_size=2"), "--set 'wrld_size=2': unknown key"),
    "set bad yaml": (value("", "--set", "world_size=[1,2"), "not valid YAML"),
    "set bad value": (value("", "--set", "world_size=abc"), "--set 'world_size=abc'"),
    "set bad compressor": (value("", "--set", "compressor=[{name: qsgd, bitz: 4}]"),
                           "--set 'compressor="),
    "set on a list file": (scenario("- a\n", "--set", "seed=1"), "must be a YAML mapping"),
    "launcher option": (value("", "--launcher", "k8s"), "'k8s' is not one of"),
    "unknown option": (value("", "--frobnicate"), "No such option"),
    "out is a file": (command("sweep", "--out", "/etc/hostname", "--dry-run"), "is a file"),
    "out is a device": (command("sweep", "--out", "/dev/null", "--dry-run"), "not a directory"),
    "unknown command": (command("frobnicate"), "No such command"),
    "report missing dir": (command("report", "{tmp}/nodir"), "does not exist"),
    "report a file": (command("report", "/dev/null"), "not a directory"),
    "report empty dir": (command("report", "{tmp}"), "no runs found"),
    "report format": (command("report", "{tmp}", "--format", "html"), "'html' is not one of"),
    "report B missing": (command("report", "{tmp}", "{tmp}/nodir"), "no runs found"),
    "gate without B": (command("report", "{tmp}", "--fail-if-slower", "5"), "compares two"),
    "gate negative": (command("report", "{tmp}", "{tmp}", "--fail-if-slower", "-1"), "x>=0"),
    "gate not a number": (command("report", "{tmp}", "{tmp}", "--fail-if-slower", "x"), "float"),
    "bench compressor": (command("bench", "kernels", "--compressor", "qsgd:bits=99"), "bits"),
    "bench sizes": (command("bench", "kernels", "--sizes", "-1"), "sizes"),
    "bench scheme": (command("bench", "comm", "--scheme", "ringg"), "unknown scheme 'ringg'"),
    "cost model missing": (command("cost", "predict", "{tmp}/nope.json"), "not found"),
    "cost model not json": (command("cost", "predict", "/etc/hostname"), "JSON"),
    "cost fit nothing": (command("cost", "fit", "{tmp}/nodir", "--out", "{tmp}/m.json"),
                         "not a results directory"),
    "utilization no dir": (command("cost", "utilization", "{tmp}/nodir"),
                           "not a results directory"),
    "utilization no runs": (command("cost", "utilization", "{tmp}"), "no ok runs"),
    "utilization model": (command("cost", "utilization", "{tmp}", "--model", "{tmp}/nope.json"),
                          "not found"),
    "models extra argument": (command("models", "extra"), "unexpected extra argument"),
}  # fmt: skip


def run(argv: list[str]) -> tuple[object, str]:
    """(exit code, stderr) of ``qbench ARGV`` in this process; an escaped exception is
    returned as its traceback text in place of a code."""
    err = io.StringIO()
    saved = sys.argv
    sys.argv = ["qbench", *argv]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                main()
                code: object = 0
            except SystemExit as e:
                code = e.code
            except BaseException as e:  # what a user would see as a traceback
                import traceback

                code = "".join(traceback.format_exception(e))
    finally:
        sys.argv = saved
    return code, err.getvalue()


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2(case: str, tmp_path: Path) -> None:
    make, needle = CASES[case]
    code, err = run(make(tmp_path))
    lines = err.strip().splitlines()
    assert code == 2, f"exit {code}: {err}"
    assert len(lines) == 1 and lines[0].startswith("qbench: error: "), err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err


def test_there_are_many_cases() -> None:
    assert len(CASES) >= 100


def test_dry_run_shows_every_exclusion_when_nothing_can_run(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(OK + "backend: mpi\nscheme: ddp\ncompressor: [none, fp16]\n")
    out = io.StringIO()
    saved = sys.argv
    sys.argv = ["qbench", "sweep", str(path), "--dry-run"]
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(io.StringIO()),
            pytest.raises(SystemExit) as e,
        ):
            main()
    finally:
        sys.argv = saved
    assert e.value.code == 2
    table = out.getvalue()
    assert "2 excluded" in table and table.count("torch's MPI backend is not built") == 2


def test_cli_spec_form_works_inside_a_scenario(tmp_path: Path) -> None:
    """``qsgd:bits=4`` in a scenario means what it means on the command line."""
    from qbench.spec import matrix
    from qbench.spec import scenario as scenario_mod

    cli_form = scenario_mod.loads(OK + "compressor: ['qsgd:bits=4,bucket_size=128']\n"
                                  "scheme: ['reduce-broadcast:overlap=2']\n")  # fmt: skip
    mapping = scenario_mod.loads(OK + "compressor: [{name: qsgd, bits: 4, bucket_size: 128}]\n"
                                 "scheme: [{name: reduce-broadcast, overlap: 2}]\n")  # fmt: skip
    ids = [r.run_id for r in matrix.expand(cli_form).runs]
    assert ids == [r.run_id for r in matrix.expand(mapping).runs]
    assert ids[0].startswith("mlp-gloo-reduce-broadcast+overlap2-qsgd-4b-b128-w2-")


@pytest.mark.parametrize(
    "case", ["binary file", "directory", "compressor key typo", "set unknown key"]
)
def test_the_terminal_shows_only_one_line(case: str, tmp_path: Path) -> None:
    make, needle = CASES[case]
    proc = qbench(*make(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout == "", proc.stdout
    assert needle in proc.stderr and "Traceback" not in proc.stderr


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=60).map(lambda b: OK.encode() + b),  # a good start, then junk bytes
    st.text(max_size=200).map(lambda t: t.encode("utf-16")),
))  # fmt: skip
def test_any_bytes_as_a_scenario_give_a_matrix_or_one_line(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    code, err = run(["sweep", str(path), "--dry-run"])
    assert code in (0, 2), f"{code}: {err}"
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
