"""A route consumer killed with SIGKILL inside a batch: its effects outside the database
happen again (at-least-once), while the idempotency guard keeps its database effects to
one per message id, although every job was also sent twice."""

from __future__ import annotations

from pathlib import Path

import pytest
import route_app
from clusters import lag, start_instance, stop_instance, wait_until, write_config
from sqlalchemy import MetaData, func, select

from messaging import Database, MessageStore

pytestmark = pytest.mark.multiprocess

JOBS = 40


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [route_app.metadata]


def _rows(db: Database) -> int:
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(route_app.jobs_done)).scalar_one())


def test_sigkill_mid_batch_repeats_outside_effects_but_not_guarded_ones(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    effects = tmp_path / "effects.txt"
    effects.touch()
    monkeypatch.setenv("ROUTE_APP_EFFECTS", str(effects))
    store = MessageStore(db)
    with db.transaction() as conn:
        route_app.metadata.create_all(conn)
    with db.transaction() as conn:
        for _copy in range(2):  # an at-least-once sender: every job sent twice, same id
            for i in range(JOBS):
                store.send(conn, "test-jobs", route_app.Job(f"j{i}"), message_id=f"job-{i}")
    config = write_config(tmp_path / "config.yaml", db, batch_size=5)

    def lines() -> list[str]:
        return effects.read_text(encoding="utf-8").split()

    def part_way() -> bool:
        """Some batches committed and 3 or 4 of the next 5 effects done: at least two
        50 ms jobs are left before it commits. The rows are read on both sides of the
        effects, so a commit in between is never mistaken for a batch in flight."""
        before = _rows(db)
        effects = len(lines())
        return before == _rows(db) > 0 and 3 <= effects - before <= 4

    first = start_instance(config, "jobs-1", "route_app")
    try:
        wait_until(part_way, timeout=60, what="a batch part-way done after some committed ones")
    finally:
        first.kill()
        first.wait(timeout=10)
    assert len(lines()) > _rows(db), "the kill did not land inside a batch"

    second = start_instance(config, "jobs-2", "route_app")
    try:
        wait_until(lambda: lag(db, "test-jobs") == 0, timeout=60, what="the restart to finish")
    finally:
        assert stop_instance(second) == 0

    done = lines()
    assert set(done) == {f"j{i}" for i in range(JOBS)}  # every job at least once
    assert len(done) > JOBS  # the killed batch ran again: at-least-once, not once
    with db.read() as conn:
        rows = conn.execute(select(route_app.jobs_done.c.job_id)).scalars().all()
    assert sorted(rows) == sorted(f"j{i}" for i in range(JOBS))  # the guard: once per id
