"""``qbench sweep --rerun-disturbed N`` (issue 31, item 9): disturbed runs go again until an
attempt is clean, never more than N times; every attempt's files stay under attempts/<n>/, and a
rerun that fails gives the last ok attempt back. A stand-in for the launch writes the records.
"""

from __future__ import annotations

from pathlib import Path

from qbench.launch import runfiles, sweep
from qbench.records.schema import RunRecord
from qbench.records.store import ResultStore
from qbench.spec import matrix, scenario
from tests.records.test_interference import _doc


def _specs() -> list[matrix.RunSpec]:
    text = "name: t\nmodel: mlp\nworld_size: 2\ncompressor: [none, {name: qsgd, bits: 4}]\n"
    return matrix.expand(scenario.loads(text, "<test>")).runs


class _FakePass:
    """Stands in for a launch: each call writes every run's record, disturbed or not as
    ``others`` (per run id, one value per call) says; ``status`` likewise."""

    def __init__(self, store: ResultStore, others: dict[str, list[float]],
                 status: dict[str, list[str]] | None = None) -> None:  # fmt: skip
        self.store, self.others, self.status, self.calls = store, others, status or {}, 0

    def __call__(self, specs: list[matrix.RunSpec]) -> None:
        for spec in specs:
            k = self.calls
            status = self.status.get(spec.run_id, ["ok"] * 9)[k]
            self.store.write_record(RunRecord(
                run_id=spec.run_id, status=status, labels={}, spec={},
                interference=_doc(self.others[spec.run_id][k]), error=f"attempt {k}",
            ))  # fmt: skip
        self.calls += 1


def _rerun(tmp_path: Path, limit: int, fake: _FakePass) -> sweep.SweepSummary:
    summary = sweep.SweepSummary(out=tmp_path, total=2)
    seen: list[tuple[int, int]] = []
    again = sweep.Rerun(fake.store, limit, fake, summary, lambda s, k, n: seen.append((k, n)))
    specs = _specs()
    fake(specs)  # the sweep's own pass
    again.run(specs)
    assert seen == [(k, limit) for k in range(1, fake.calls)]
    return summary


def test_rerun_stops_at_its_bound_and_keeps_every_attempt(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    first, second = (s.run_id for s in _specs())
    # the first run stays disturbed (3 s of others in 4 s); the second is clean from the start
    fake = _FakePass(store, {first: [3.0] * 9, second: [0.0] * 9})
    summary = _rerun(tmp_path, 2, fake)
    assert fake.calls == 1 + 2  # the sweep's pass, then two reruns: no more
    assert summary.reruns == {first: 2} and summary.still_disturbed == [first]
    attempts = runfiles.attempts_of(store, _specs()[0])
    assert [p.name for p in attempts] == ["1", "2"]
    assert [store.read_record_at(p).error for p in attempts] == ["attempt 0", "attempt 1"]
    assert store.read_record(first).error == "attempt 2"  # the last attempt is the run
    assert not store.attempts_dir(second).exists()  # a clean run never goes again


def test_rerun_stops_at_the_first_clean_attempt(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    first, second = (s.run_id for s in _specs())
    fake = _FakePass(store, {first: [3.0, 3.0, 0.0, 3.0], second: [3.0, 0.0, 3.0, 3.0]})
    summary = _rerun(tmp_path, 5, fake)
    assert fake.calls == 3 and summary.still_disturbed == []
    assert summary.reruns == {first: 2, second: 1}
    assert store.read_record(first).error == "attempt 2"  # clean: the one kept
    assert store.read_record(second).error == "attempt 1"


def test_a_failed_rerun_gives_the_last_ok_attempt_back(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    first, second = (s.run_id for s in _specs())
    fake = _FakePass(store, {first: [3.0, 3.0], second: [0.0, 0.0]},
                     status={first: ["ok", "failed"]})  # fmt: skip
    summary = _rerun(tmp_path, 3, fake)
    record = store.read_record(first)
    assert record is not None and (record.status, record.error) == ("ok", "attempt 0")
    assert summary.statuses[first] == "ok" and summary.still_disturbed == [first]
    # nothing lost: the failed attempt is archived beside
    kept = [store.read_record_at(p) for p in runfiles.attempts_of(store, _specs()[0])]
    assert [r.error for r in kept if r is not None] == ["attempt 1"]
