"""One run on a connected rank, start to end: join the communicator, build the training loop the
spec names (``qbench.spec.loop``: flat, DDP, FSDP or async-ps), warm up, measure, write this
rank's parts (also the rows done so far when it fails) and tag a failure with the line the sweep
driver quotes. The process entry point around it is ``qbench.run.worker``; a warm rank group's
runs in turn are ``qbench.run.group``.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from pathlib import Path

import torch

from qbench import comm
from qbench.records.schema import WORKER_FAILED as FAILED_TAG
from qbench.records.schema import epochs_frame
from qbench.records.store import (
    atomic_write_json,
    atomic_write_parquet,
    epochs_part,
    host_part,
    model_part,
    parts_beside,
    rank_part,
    trace_path,
)
from qbench.run import async_ps, interference, memory, profile, workload
from qbench.run.loops.ddp import DDPRun
from qbench.run.loops.flat import Run, async_parts
from qbench.run.loops.training import Training, device_for
from qbench.run.replay import loops as replay_loops
from qbench.spec.runspec import RunSpec
from qbench.timing import PhaseTimer


def fault_injection(rank: int, run_id: str, index: int | None = None) -> tuple[int, str] | None:
    """QBENCH_FAULT=RANK:ITERATION[:MODE][@RUN] makes that rank die abruptly (MODE ``exit``, the
    default), raise (``raise``) or hang (``hang``) at that iteration, to test that a failed or
    hung rank fails its run, naming the rank, instead of hanging the others; ``leak`` keeps
    LEAK_MB MiB for good and goes on, to test that a group's memory check catches a leak;
    ``spike`` holds SPIKE_MB MiB for a moment, to test that a run's peak is its own.
    ``@RUN`` limits it to one run: its run id, or in group mode its index in the rank group.
    Testing only."""
    fault = os.environ.get("QBENCH_FAULT")
    if not fault:
        return None
    fault, _, target = fault.partition("@")
    if target and target not in (run_id, str(index)):
        return None
    parts = fault.split(":")
    if int(parts[0]) != rank:
        return None
    return int(parts[1]), (parts[2] if len(parts) > 2 else "exit")


def slow_start() -> None:
    """QBENCH_SLOW_START=SECONDS delays each rank before it joins the communicator, as a
    loaded machine does, to test that a group's first run is not timed from its launch.
    Testing only."""
    time.sleep(float(os.environ.get("QBENCH_SLOW_START", "0")))


_LEAKED: list[torch.Tensor] = []
LEAK_MB = 16
SPIKE_MB = 256  # far above the run-to-run noise of a small model's peak (tens of MiB)


def _inject(fault: tuple[int, str], it: int) -> None:
    if fault[1] == "leak":  # memory a run never gives back, so tests can see the check fire
        _LEAKED.append(torch.ones(LEAK_MB * 2**18))  # float32: LEAK_MB MiB, every page touched
        return
    if fault[1] == "spike":  # every page touched, then given back (mmap'd: to the kernel)
        torch.ones(SPIKE_MB * 2**18)
        return
    if fault[1] == "raise":
        raise RuntimeError(f"injected fault at iteration {it} (QBENCH_FAULT)")
    if fault[1] == "hang":
        while True:  # a rank stuck for good: only the run's timeout ends it
            time.sleep(3600)
    os._exit(3)  # simulate a crashed rank: no clean-up, no message, no records


def connect(spec: RunSpec, timeout_s: float) -> comm.Comm:
    """Join the rank group's communicator, one thread per CPU rank."""
    if spec.placement.backend != "nccl":
        torch.set_num_threads(1)  # one thread per CPU rank
    return comm.connect(spec.placement.backend, timeout_s=timeout_s)


def tag_failure(rank: object, e: BaseException) -> None:
    """The one line the sweep driver quotes in run.json (see runfiles._error_line)."""
    print(f"{FAILED_TAG} {rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def run_config(
    spec: RunSpec, spec_path: Path, cm: comm.Comm, fault: tuple[int, str] | None = None
) -> bool:
    """One run on this rank: build, warm up, measure, write this rank's parts (also the rows
    done so far when it fails). False when it failed, after printing the tagged line the driver
    quotes; the caller then ends the job so that no peer waits for this rank."""
    parts = parts_beside(spec_path)
    _write_host(parts, cm.rank, spec)
    if cm.rank == 0:
        _write_model(parts, spec)
    run: Training | None = None
    tracer: profile.Tracer | None = None
    peak: memory.Peak | None = None
    try:
        peak = memory.Peak(
            parts, cm.rank, device_for(spec.placement.device_kind)
        )  # before the model
        watch = interference.Watch(parts, cm.rank, together=cm.barrier)
        if spec.loop.loop == "async-ps":  # server + workers (seed 003)
            run = Training(spec, cm, shard=async_ps.shard(cm.rank, cm.world_size))
            watch.start()  # its loop is its own: the whole serving time, warm-up included
            async_ps.run(async_parts(run))
            watch.stop()
            cm.barrier()
            return True
        run = training_loop(spec, cm, parts)
        # replayed codec calls pace themselves; the timer stretches the rest (qbench.timing)
        timer = PhaseTimer(run.device, stretch=spec.clock.stretch, pacing=run.pacing)
        trace = trace_path(parts, cm.rank) if spec.measurement.profile else None
        tracer = profile.Tracer(
            trace,
            spec.measurement.warmup,
            run.total_iterations - spec.measurement.warmup,
            run.device,
            cm,
        )
        steps = range(run.total_iterations)
        for measured, its in enumerate(
            (steps[: spec.measurement.warmup], steps[spec.measurement.warmup :])
        ):
            if measured:  # /proc is read here and after the loop: never in a timed iteration
                watch.start()
            for it in its:
                if fault is not None and it == fault[0]:
                    _inject(fault, it)
                run.before(it)
                run.iteration(it, timer)
                tracer.step()
                run.after(it)
        watch.stop()
        cm.barrier()
        return True
    except Exception as e:
        traceback.print_exc()
        tag_failure(cm.rank, e)
        return False
    finally:
        if peak is not None:
            peak.write(None if run is None else run.state_mib())
        if tracer is not None:
            tracer.close()
        if run is not None:
            run.close()
        if run is not None and run.rows:
            _write_parts(parts, cm.rank, run)


def training_loop(spec: RunSpec, cm: comm.Comm, parts: Path) -> Training:
    """The lock-step loop ``spec.loop`` names (``qbench.spec.loop``): FSDP's, DDP's buckets
    during backward, or flat after it; the latter two with the model's work replayed for
    ``compute: replay`` (its timeline beside ``parts``)."""
    choice = spec.loop
    if choice.loop == "fsdp":
        # torch's FSDP machinery (~0.45 s to import) only where it runs
        from qbench.run.loops.fsdp import FSDPRun

        return FSDPRun(spec, cm)
    if choice.replayed:
        if choice.loop == "ddp":
            return replay_loops.ReplayDDPRun(spec, cm, parts)
        return replay_loops.ReplayRun(spec, cm, parts)
    if choice.loop == "ddp":
        return DDPRun(spec, cm)
    return Run(spec, cm)


def _write_model(parts: Path, spec: RunSpec) -> None:
    """The model's size and forward FLOPs per sample (meta device, cached on disk): the run's
    ``numel`` and ``gflops_per_sample`` labels, the computation side of seed 002's
    communication / computation ratio, for reports that cannot import the models."""
    atomic_write_json(model_part(parts), workload.model_stats(spec))  # zoo or factory


def _write_host(parts: Path, rank: int, spec: RunSpec) -> None:
    """Where this rank ran (the driver lists the hosts in the run's machine.json)."""
    doc = {"rank": rank, "hostname": socket.gethostname(), "pid": os.getpid(),
           "device": spec.placement.device_kind}  # fmt: skip
    atomic_write_json(host_part(parts, rank), doc)


def _write_parts(parts: Path, rank: int, run: Training) -> None:
    atomic_write_parquet(rank_part(parts, "rank", rank), run.frame())
    if rank == 0 and run.epoch_rows:
        atomic_write_parquet(epochs_part(parts), epochs_frame(run.epoch_rows))
    if isinstance(run, Run) and run.telemetry is not None:
        atomic_write_parquet(rank_part(parts, "telemetry", rank), run.telemetry.frame())
    buckets = run.buckets_frame()
    if buckets is not None:
        atomic_write_parquet(rank_part(parts, "buckets", rank), buckets)
