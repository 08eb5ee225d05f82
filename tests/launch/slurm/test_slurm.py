"""The Slurm launcher: pure argv / script builders and option parsing (fast), and runs on a real
single-node cluster started by tests/slurm_cluster.py (slow, marked slurm)."""

from __future__ import annotations

import importlib
import itertools
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from qbench.errors import UserError
from qbench.launch import local, slurm
from qbench.launch.slurm import SlurmOptions, jobs, options, runs
from qbench.records.store import atomic_write_json
from qbench.spec import matrix, scenario
from qbench.spec.runspec import RunSpec
from tests.slurm_cluster import slurm_cluster  # noqa: F401 (the fixture, used by name)

# ---------------------------------------------------------------------------------------------
# SlurmOptions.parse


def test_parse_defaults_and_full_mapping() -> None:
    assert SlurmOptions.parse(None) == SlurmOptions()
    assert SlurmOptions.parse({}) == SlurmOptions()
    o = SlurmOptions.parse({
        "partition": "gpu", "time": "00:30:00", "account": "x", "mode": "sbatch",
        "array": True, "max_parallel": 4, "nodes": 2, "gpus_per_node": 4, "cpus_per_task": 1,
        "extra_args": ["--exclusive"], "srun_args": ["--cpu-bind=cores"], "mpi": "pmix",
        "qos": "normal",
    })  # fmt: skip
    assert (o.partition, o.time, o.account, o.mode, o.array) == (
        "gpu",
        "00:30:00",
        "x",
        "sbatch",
        True,
    )
    assert (o.max_parallel, o.nodes, o.gpus_per_node, o.cpus_per_task) == (4, 2, 4, 1)
    assert o.extra_args == ("--exclusive",) and o.srun_args == ("--cpu-bind=cores",)
    assert hash(o)  # frozen: usable as a key


@pytest.mark.parametrize(
    "value", ["30", "30:00", "1:30:00", "2-0", "2-12:00", "1-00:00:00", "UNLIMITED"]
)
def test_parse_accepts_slurm_times(value: str) -> None:
    assert SlurmOptions.parse({"time": value}).time == value


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"partiton": "gpu"}, ["unknown key 'partiton'", "did you mean 'partition'", "valid keys"]),
        ({"partition": 3}, ["slurm.partition", "3", "int", "partition: gpu"]),
        ({"partition": "a b"}, ["slurm.partition", "'a b'"]),
        ({"nodes": "2"}, ["slurm.nodes", "'2'", "str", "integer >= 1", "nodes: 2"]),
        ({"nodes": 0}, ["slurm.nodes", "integer >= 1"]),
        ({"gpus_per_node": -1}, ["slurm.gpus_per_node", "integer >= 0"]),
        ({"max_parallel": True}, ["slurm.max_parallel", "True", "bool"]),
        ({"array": "yes"}, ["slurm.array", "true or false", "'yes'"]),
        ({"mode": "batch"}, ["slurm.mode", "auto, sbatch, srun", "'batch'"]),
        ({"mpi": "pmi2"}, ["slurm.mpi", "mpirun, pmix"]),
        ({"time": 5400}, ["slurm.time", "5400", "quoted", "00:30:00"]),
        ({"time": "30 min"}, ["slurm.time", "'30 min'", "HH:MM:SS"]),
        ({"extra_args": "--exclusive"}, ["slurm.extra_args", "list of arguments", "--exclusive"]),
        ({"srun_args": [1]}, ["slurm.srun_args", "list of arguments"]),
    ],
)
def test_parse_errors_are_one_line_naming_key_value_and_fix(raw: dict, words: list[str]) -> None:
    with pytest.raises(UserError) as e:
        SlurmOptions.parse(raw)
    msg = str(e.value)
    assert "\n" not in msg
    assert "e.g." in msg or "valid keys" in msg
    for w in words:
        assert w in msg, msg


def test_parse_rejects_a_non_mapping() -> None:
    with pytest.raises(UserError, match=r"slurm: must be a mapping .* got 'gpu' \(str\)"):
        SlurmOptions.parse("gpu")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# argv builders: lists of plain arguments, never shell strings

OPTS = SlurmOptions(
    partition="gpu", account="proj", time="00:30:00", gpus_per_node=4, cpus_per_task=2,
    extra_args=("--exclusive",), srun_args=("--cpu-bind=cores",),
)  # fmt: skip


def _pairs(argv: list[str]) -> dict[str, str]:
    return {a: b for a, b in itertools.pairwise(argv) if a.startswith("--")}


def test_sbatch_argv() -> None:
    argv = slurm.sbatch_argv(
        Path("/r/slurm-job.sh"), job_name="qbench-x", output=Path("/r/stdout.log"),
        error=Path("/r/stderr.log"), ntasks=8, options=OPTS, nodes=2,
    )  # fmt: skip
    assert argv[0] == "sbatch" and argv[-1] == "/r/slurm-job.sh"
    assert {"--parsable", "--wait", "--export=ALL", "--exclusive"} <= set(argv)
    p = _pairs(argv)
    assert p["--job-name"] == "qbench-x"
    assert (p["--output"], p["--error"]) == ("/r/stdout.log", "/r/stderr.log")
    assert (p["--ntasks"], p["--nodes"], p["--gpus-per-node"], p["--cpus-per-task"]) == (
        "8", "2", "4", "2",
    )  # fmt: skip
    assert (p["--time"], p["--partition"], p["--account"]) == ("00:30:00", "gpu", "proj")
    assert not any(a.startswith("--array") for a in argv)
    assert all(isinstance(a, str) for a in argv)


def test_sbatch_argv_array_and_defaults() -> None:
    argv = slurm.sbatch_argv(
        "s.sh", job_name="j", output="o", error="e", ntasks=2, options=SlurmOptions(),
        time_s=90, array=slurm.array_range(3, 2),
    )  # fmt: skip
    assert "--array=0-2%2" in argv
    p = _pairs(argv)
    assert p["--time"] == "3"  # 90 s -> 2 min + 1 min to start
    for absent in ("--partition", "--account", "--gpus-per-node", "--cpus-per-task", "--nodes"):
        assert absent not in argv


def test_gpus_per_node_default_follows_the_device() -> None:
    def spec(backend: str, ws: int, device: str) -> RunSpec:
        place = SimpleNamespace(backend=backend, world_size=ws, device_kind=device)
        return SimpleNamespace(placement=place)  # type: ignore[return-value]

    assert slurm.gpus_for(spec("nccl", 8, "cuda"), SlurmOptions(), nodes=2) == 4
    assert slurm.gpus_for(spec("gloo", 3, "cuda"), SlurmOptions(), nodes=1) == 3
    assert slurm.gpus_for(spec("gloo", 8, "cpu"), SlurmOptions(), nodes=2) == 0
    assert slurm.gpus_for(spec("nccl", 8, "cuda"), SlurmOptions(gpus_per_node=0), nodes=2) == 0
    argv = slurm.sbatch_argv(
        "s", job_name="j", output="o", error="e", ntasks=8, options=SlurmOptions(), gpus_per_node=4
    )
    assert _pairs(argv)["--gpus-per-node"] == "4"


def test_array_range_and_time_limit() -> None:
    assert slurm.array_range(1) == "0-0"
    assert slurm.array_range(5, 4) == "0-4%4"
    with pytest.raises(ValueError):
        slurm.array_range(0)
    assert slurm.time_limit(1) == "2"
    assert slurm.time_limit(600) == "11"


def test_srun_argv_inside_an_allocation() -> None:
    argv = slurm.srun_argv(["python", "-m", "qbench.run.worker", "s.json"], 4, OPTS, nodes=2)
    assert argv[:3] == ["srun", "--ntasks", "4"]
    assert "--kill-on-bad-exit=1" in argv and "--mpi=none" in argv
    assert _pairs(argv)["--nodes"] == "2" and _pairs(argv)["--cpus-per-task"] == "2"
    assert "--partition" not in argv and "--time" not in argv  # the allocation has them
    assert argv[-5:] == ["--cpu-bind=cores", "python", "-m", "qbench.run.worker", "s.json"]


def test_srun_argv_allocating() -> None:
    argv = slurm.srun_argv(["prog"], 2, OPTS, allocate=True, time_s=60, job_name="qbench-r")
    p = _pairs(argv)
    assert (p["--ntasks"], p["--partition"], p["--time"], p["--job-name"]) == (
        "2", "gpu", "00:30:00", "qbench-r",
    )  # fmt: skip
    assert "--exclusive" in argv and argv[-1] == "prog"


def test_launch_argv_per_backend() -> None:
    gloo = slurm.launch_argv("gloo", "/r/spec.json", 2, SlurmOptions(), python="py")
    assert gloo[0] == "srun" and "--mpi=none" in gloo
    assert gloo[-4:] == ["py", "-m", "qbench.run.worker", "/r/spec.json"]
    mpi = slurm.launch_argv(
        "mpi", "/r/spec.json", 2, SlurmOptions(), python="py", mpirun="/v/mpirun"
    )
    assert mpi[:3] == ["/v/mpirun", "-np", "2"] and mpi[-1] == "/r/spec.json"
    pmix = slurm.launch_argv("mpi", "/r/spec.json", 2, SlurmOptions(mpi="pmix"), python="py")
    assert pmix[0] == "srun" and "--mpi=pmix" in pmix
    with pytest.raises(UserError, match="needs an allocation"):
        slurm.launch_argv("mpi", "s", 2, SlurmOptions(), allocate=True)


def test_batch_script_is_valid_bash_and_quotes_odd_paths(tmp_path: Path) -> None:
    run_dir = tmp_path / "run dir 'x'"
    run_dir.mkdir()
    spec = run_dir / "spec.json"
    command = slurm.launch_argv("gloo", spec, 2, SlurmOptions(), python=sys.executable)
    text = slurm.batch_script(command, run_dir, torch_env=True, title="qbench run r")
    assert text.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    (srun_line,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert shlex.split(srun_line) == command  # the one shell: shlex-joined argv
    assert "MASTER_PORT" in text
    assert "MASTER_PORT" not in slurm.batch_script(command, run_dir, torch_env=False)


def test_batch_script_marks_start_and_writes_the_exit_code(tmp_path: Path) -> None:
    """Run the generated script with bash (no Slurm): start marker, exit code file, port."""
    cmd = [sys.executable, "-c", "import os, sys; print(os.environ['MASTER_PORT']); sys.exit(3)"]
    script = tmp_path / "job.sh"
    script.write_text(slurm.batch_script(cmd, tmp_path, torch_env=True))
    p = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert p.returncode == 3
    assert 1024 <= int(p.stdout) < _ephemeral_low()  # drawn where no connection takes it
    assert (tmp_path / slurm.STARTED).exists()
    assert (tmp_path / slurm.EXIT_CODE).read_text().strip() == "3"


def _ephemeral_low() -> int:
    return int(local.EPHEMERAL_RANGE.read_text().split()[0])


def test_free_ports_are_drawn_below_the_ephemeral_range_and_bind() -> None:
    """The kernel hands out ephemeral ports to every outgoing connection; one of them took a
    rendezvous port drawn there (bind to 0) before the ranks bound it (CI, a job array)."""
    ports = {local.free_port() for _ in range(20)}
    assert all(1024 <= port < _ephemeral_low() for port in ports)
    assert len(ports) > 10  # drawn at random, not the same few
    for port in list(ports)[:3]:
        with socket.socket() as s:
            s.bind(("", port))


def test_array_script_runs_the_task_s_line(tmp_path: Path) -> None:
    """Task i reads line i of the list files, logs into that run dir, writes its exit code."""
    dirs = [tmp_path / f"run {i}" for i in range(3)]
    for d in dirs:
        d.mkdir()
    (tmp_path / "specs.txt").write_text("".join(f"{d / 'spec.json'}\n" for d in dirs))
    (tmp_path / "dirs.txt").write_text("".join(f"{d}\n" for d in dirs))
    prog = "import sys; print('spec', sys.argv[1]); sys.exit(int(sys.argv[1].split()[-1][0]))"
    command = [sys.executable, "-c", prog, slurm.SPEC_SLOT]
    text = slurm.array_script(
        command, tmp_path / "specs.txt", tmp_path / "dirs.txt", torch_env=False
    )
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    script = tmp_path / "array.sh"
    script.write_text(text)
    for task in (0, 1):
        env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task)}
        p = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
        assert p.returncode == task and p.stdout == ""
        d = dirs[task]
        assert (d / "stdout.log").read_text() == f"spec {d / 'spec.json'}\n"
        assert (d / slurm.EXIT_CODE).read_text().strip() == str(task)
        assert (d / slurm.STARTED).exists()
    assert not (dirs[2] / slurm.STARTED).exists()
    with pytest.raises(ValueError, match="must end with"):
        slurm.array_script(["x", "spec.json"], "a", "b", torch_env=False)


# ---------------------------------------------------------------------------------------------
# torch env:// from SLURM_*

SRUN_ENV = {
    "SLURM_JOB_ID": "1234", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-09]",
    "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.5",
}  # fmt: skip


def test_torch_env_from_slurm() -> None:
    assert slurm.torch_env_from_slurm(SRUN_ENV) == {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1", "MASTER_ADDR": "gpu07", "MASTER_PORT": str(20000 + 1234),
    }  # fmt: skip


def test_torch_env_keeps_the_launchers_port_and_address() -> None:
    env = {**SRUN_ENV, "MASTER_PORT": "40001", "MASTER_ADDR": "head"}
    out = slurm.torch_env_from_slurm(env)
    assert (out["MASTER_ADDR"], out["MASTER_PORT"]) == ("head", "40001")


def test_torch_env_fallbacks() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.5"}
    out = slurm.torch_env_from_slurm(env)
    assert out["MASTER_ADDR"] == "10.0.0.5"
    assert (out["LOCAL_RANK"], out["LOCAL_WORLD_SIZE"], out["MASTER_PORT"]) == ("0", "2", "29500")
    with pytest.raises(ValueError, match="SLURM_PROCID"):
        slurm.torch_env_from_slurm({"SLURM_NTASKS": "2"})
    with pytest.raises(ValueError, match="SLURM_NTASKS"):
        slurm.torch_env_from_slurm({"SLURM_PROCID": "0"})


def test_apply_worker_env_only_for_srun_tasks() -> None:
    env = dict(SRUN_ENV)
    assert slurm.apply_worker_env(env) and env["RANK"] == "5"
    torchrun = {**SRUN_ENV, "RANK": "3"}
    assert not slurm.apply_worker_env(torchrun) and torchrun["RANK"] == "3"
    mpirun = {**SRUN_ENV, "OMPI_COMM_WORLD_RANK": "2"}  # mpirun in a batch job
    assert not slurm.apply_worker_env(mpirun) and "RANK" not in mpirun
    local: dict[str, str] = {}
    assert not slurm.apply_worker_env(local) and local == {}


def test_a_rank_loads_only_the_env_adapter() -> None:
    """Every rank imports qbench.run.worker: of the Slurm launcher it must load the env://
    adapter only, never the options, the builders, the checks or the job state machine."""
    code = "import sys, qbench.run.worker; print(*sorted(m for m in sys.modules if 'slurm' in m))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    assert out == ["qbench.launch.slurm", "qbench.launch.slurm.env"]


def test_the_package_names_are_its_modules_own() -> None:
    """Each name the package offers is loaded, on first use, from the module that defines it."""
    for name in slurm.__all__:
        module = importlib.import_module(f"qbench.launch.slurm.{slurm._HOME[name]}")
        assert getattr(slurm, name) is getattr(module, name), name
    assert slurm.run is runs.run and SlurmOptions is options.SlurmOptions
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        slurm.nope  # noqa: B018 (the lookup is the test)


HOSTLISTS = ["localhost", "node1,node2", "gpu[07-09,11],cpu1", "n[001-004]", "rack[1-2]-n[3-4]",
             "a[5],b[1-3]"]  # fmt: skip


@pytest.mark.parametrize("nodelist", HOSTLISTS)
def test_first_host_matches_scontrol(nodelist: str) -> None:
    expected = {
        "localhost": "localhost", "node1,node2": "node1", "gpu[07-09,11],cpu1": "gpu07",
        "n[001-004]": "n001", "rack[1-2]-n[3-4]": "rack1-n3", "a[5],b[1-3]": "a5",
    }  # fmt: skip
    assert slurm.first_host(nodelist) == expected[nodelist]
    if shutil.which("scontrol"):  # needs no daemon
        p = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True
        )
        if p.returncode == 0:
            assert p.stdout.split()[0] == expected[nodelist]


def test_tasks_per_node() -> None:
    assert slurm.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.tasks_per_node("4") == [4]
    with pytest.raises(ValueError):
        slurm.tasks_per_node("x")


def test_failed_rank_from_srun_report() -> None:
    err = (
        "srun: error: localhost: task 1: Exited with exit code 7\n"
        "srun: error: localhost: task 0: Killed\n"
    )
    assert slurm.failed_rank(err) == (1, 7)
    assert slurm.failed_rank("srun: error: n1: tasks 2-3: Exited with exit code 1\n") == (2, 1)
    assert slurm.failed_rank("nothing") is None


def test_mode_and_submit_env() -> None:
    assert slurm.resolve_mode("auto", {"SLURM_JOB_ID": "3"}) == "srun"
    assert slurm.resolve_mode("auto", {}) == "sbatch"
    assert slurm.resolve_mode("sbatch", {"SLURM_JOB_ID": "3"}) == "sbatch"
    env = jobs._submit_env({"SLURM_JOB_ID": "3", "SLURM_CONF": "/c", "SBATCH_X": "1", "PATH": "/b"})
    assert env == {"SLURM_CONF": "/c", "PATH": "/b"}


def test_unavailable_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match=r"sbatch not found; install Slurm .* --launcher local"):
        slurm.check_available()
    assert slurm.describe().startswith("slurm: not available (sbatch not found")


def test_controller_down_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients present but no controller: the reason is sinfo's error."""
    for tool in slurm.TOOLS:
        fake = tmp_path / tool
        fake.write_text(
            "#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller' >&2\nexit 1\n"
        )
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(UserError, match=r"cannot reach the Slurm controller .*Unable to contact"):
        slurm.check_available()
    assert "Unable to contact" in slurm.describe()


# ---------------------------------------------------------------------------------------------
# A real cluster (tests/slurm_cluster.py)

TINY = """
name: slurm
model: mlp
world_size: {ws}
backend: {backend}
iterations: {iterations}
warmup: 1
seed: {seed}
timeout: 120
"""


def make_runs(tmp: Path, backend: str = "gloo", ws: str = "2", iterations: int = 3,
              seed: str = "0") -> list[tuple[RunSpec, Path, Path]]:  # fmt: skip
    """RunSpecs of a tiny scenario, with spec.json written the way sweep.execute does."""
    text = TINY.format(backend=backend, ws=ws, iterations=iterations, seed=seed)
    out = []
    for spec in matrix.expand(scenario.loads(text)).runs:
        run_dir = tmp / spec.run_id
        (run_dir / "parts").mkdir(parents=True)
        atomic_write_json(run_dir / "spec.json", spec.to_dict())
        out.append((spec, run_dir / "spec.json", run_dir))
    return out


def parts(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "parts").glob("rank-*.parquet"))


def queue() -> str:
    return subprocess.run(["squeue", "--noheader"], capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_describe_and_check_on_a_live_cluster() -> None:
    slurm.check_available()
    assert slurm.describe() == "slurm: available (sinfo: 1 node idle)"


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_sbatch_run(backend: str, tmp_path: Path) -> None:
    ((spec, spec_path, run_dir),) = make_runs(tmp_path, backend)
    t0 = time.monotonic()
    status, code = slurm.run(spec, spec_path, run_dir, 120, SlurmOptions(mode="sbatch"))
    assert (status, code) == ("ok", 0), (run_dir / "stderr.log").read_text()
    assert parts(run_dir) == ["rank-0.parquet", "rank-1.parquet"]
    assert (run_dir / "stdout.log").exists() and (run_dir / "slurm-job.sh").exists()
    assert time.monotonic() - t0 < 90
    assert queue() == ""


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_srun_pmix_mpi(tmp_path: Path) -> None:
    """mpi ranks started by srun --mpi=pmix (Slurm's PMIx plugin serves Open MPI 5)."""
    probe = subprocess.run(
        ["srun", "--ntasks", "1", "--mpi=pmix", "true"], capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        pytest.skip(f"srun --mpi=pmix does not work here: {probe.stderr.strip().splitlines()[-1:]}")
    ((spec, spec_path, run_dir),) = make_runs(tmp_path, "mpi")
    status, code = slurm.run(spec, spec_path, run_dir, 120, SlurmOptions(mpi="pmix"))
    assert (status, code) == ("ok", 0), (run_dir / "stderr.log").read_text()
    assert parts(run_dir) == ["rank-0.parquet", "rank-1.parquet"]
    assert "--mpi=pmix" in (run_dir / "slurm-job.sh").read_text()


DRIVER = """
import json, sys
from pathlib import Path
from qbench.launch import local, slurm
from qbench.spec.runspec import RunSpec
run_dir = Path(sys.argv[1])
spec = RunSpec.from_dict(json.loads((run_dir / "spec.json").read_text()))
opts = slurm.SlurmOptions.parse({})
result = slurm.run(spec, run_dir / "spec.json", run_dir, 120, opts)
print(json.dumps([slurm.resolve_mode(opts.mode), *result]))
"""


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_srun_inside_an_allocation(backend: str, tmp_path: Path) -> None:
    """qbench inside `salloc -n 2`: mode auto sees SLURM_JOB_ID and runs srun (gloo) or mpirun
    (mpi) in the allocation, no new job."""
    ((_, _, run_dir),) = make_runs(tmp_path, backend)
    (tmp_path / "driver.py").write_text(DRIVER)
    p = subprocess.run(
        ["salloc", "--ntasks", "2", "--time", "5", sys.executable, str(tmp_path / "driver.py"),
         str(run_dir)],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr + (run_dir / "stderr.log").read_text()
    assert json.loads(p.stdout.strip().splitlines()[-1]) == ["srun", "ok", 0]
    assert parts(run_dir) == ["rank-0.parquet", "rank-1.parquet"]
    assert not (run_dir / "slurm-job.sh").exists()  # a step of the allocation, not a batch job


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_job_array(tmp_path: Path) -> None:
    """Three runs, two shapes: one array of two 1-rank gloo runs (both at once on 2 CPUs) and
    one array holding the 2-rank mpi run."""
    items = make_runs(tmp_path, "gloo", ws="1", seed="[0, 1]") + make_runs(tmp_path, "mpi")
    assert len(items) == 3
    t0 = time.monotonic()
    results = slurm.run_array(items, 120, SlurmOptions(array=True, max_parallel=2))
    elapsed = time.monotonic() - t0
    for (_, _, run_dir), result in zip(items, results, strict=True):
        assert result == ("ok", 0), (run_dir / "stderr.log").read_text()
        assert (run_dir / "stdout.log").exists() and (run_dir / slurm.EXIT_CODE).exists()
    assert [len(parts(d)) for _, _, d in items] == [1, 1, 2]
    assert len(list((tmp_path / ".slurm").glob("array-*/slurm-job.sh"))) == 2  # two shapes
    assert len(list((tmp_path / ".slurm").glob("array-*/slurm-*_*.out"))) == 3  # three tasks
    assert elapsed < 120
    assert queue() == ""


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_failing_rank_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QBENCH_FAULT", "1:0:raise")
    ((spec, spec_path, run_dir),) = make_runs(tmp_path, "gloo")
    t0 = time.monotonic()
    status, code = slurm.run(spec, spec_path, run_dir, 120, SlurmOptions())
    assert status == "failed" and code not in (0, None)
    assert time.monotonic() - t0 < 90
    err = (run_dir / "stderr.log").read_text()
    assert "RuntimeError: injected fault at iteration 0" in err
    assert "rank 1 failed" in err or "1 failed: RuntimeError" in err
    assert slurm.failed_rank(err) is not None and slurm.failed_rank(err)[0] == 1  # type: ignore[index]
    assert queue() == ""


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_timeout_cancels_the_job(tmp_path: Path) -> None:
    ((spec, spec_path, run_dir),) = make_runs(tmp_path, "gloo", iterations=10**6)
    t0 = time.monotonic()
    status, code = slurm.run(spec, spec_path, run_dir, 12, SlurmOptions())
    elapsed = time.monotonic() - t0
    assert (status, code) == ("timeout", None)
    assert 12 < elapsed < 60
    assert queue() == ""  # scancel'ed and gone
    assert not (run_dir / slurm.EXIT_CODE).exists()
    assert "CANCELLED" in (run_dir / "stderr.log").read_text()


SIGTERM_DRIVER = """
import json, sys
from pathlib import Path
from qbench.launch import local, slurm
from qbench.spec.runspec import RunSpec
run_dir = Path(sys.argv[1])
spec = RunSpec.from_dict(json.loads((run_dir / "spec.json").read_text()))
try:
    slurm.run(spec, run_dir / "spec.json", run_dir, 300, slurm.SlurmOptions(mode="sbatch"))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    raise
"""


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_sigterm_cancels_the_job(tmp_path: Path) -> None:
    """SIGTERM to the driver (no handler of its own): the job is scancel'ed, then the
    KeyboardInterrupt goes on up."""
    ((_, _, run_dir),) = make_runs(tmp_path, "gloo", iterations=10**6)
    (tmp_path / "driver.py").write_text(SIGTERM_DRIVER)
    driver = subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (run_dir / slurm.STARTED).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert queue() != ""
    driver.terminate()
    out, err = driver.communicate(timeout=90)
    assert driver.returncode != 0 and out.strip() == "interrupted", err
    assert "KeyboardInterrupt" in err
    assert queue() == ""


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_refused_submission_is_one_user_error(tmp_path: Path) -> None:
    ((spec, spec_path, run_dir),) = make_runs(tmp_path, "gloo")
    with pytest.raises(UserError, match=r"sbatch refused the job \(.*Invalid partition"):
        slurm.run(spec, spec_path, run_dir, 60, SlurmOptions(partition="nope"))
    assert queue() == ""
