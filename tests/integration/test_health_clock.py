"""The health verdicts' timing, exactly, on a real database whose clock moves only when
told to: ``stalled`` past the stall timeout without a commit (each commit restarts it, a
claim too), ``unowned`` past stale-instance-timeout + 1 s after the owner's last
heartbeat or a release, ``paused`` however long a pause lasts."""

from __future__ import annotations

from collections.abc import Iterator

import health_app
import pytest
from clusters import manual_clock_database
from sqlalchemy import MetaData

from messaging import MessageStore, Settings, create_plugin_manager
from messaging._consumers import consumer_spec
from messaging._settings import (
    ConflictRetrySettings,
    ConsumerSettings,
    ExecutorSettings,
    HealthSettings,
    MessagingSettings,
)
from messaging._states import Severity, Verdict
from messaging.runtime._instance import Instance
from messaging.store._clock import ManualClock
from messaging.store._database import Database
from projections import _operations as operations
from projections._health import health_report

STALE = 3.0
STALL = 2.0
SETTINGS = Settings(
    messaging=MessagingSettings(
        consumer=ConsumerSettings(
            stale_instance_timeout=STALE,
            rebalance_interval=1.0,
            heartbeat_interval=0.5,
            batch_size=1,
            executor=ExecutorSettings(max_workers=1),  # one lane: one message a poll
            conflict_retry=ConflictRetrySettings(max_retries=3, max_delay=0.1),
        )
    ),
    health=HealthSettings(stall_timeout=STALL),
)


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [health_app.metadata]


@pytest.fixture
def clocked(db: Database, database_url: str, table_prefix: str) -> Iterator[Database]:
    """The test's database (its tables made by ``db``) seen through a manual clock."""
    manual = manual_clock_database(database_url, table_prefix)
    yield manual
    manual.dispose()


def _verdicts(db: Database) -> dict[int, str]:
    (consumer,) = health_report(db, SETTINGS)["consumers"]
    return {p["partition"]: str(p["verdict"]) for p in consumer["partitions"]}


def test_verdicts_follow_commits_heartbeats_and_operator_commands(clocked: Database) -> None:
    db = clocked
    clock = db.clock
    assert isinstance(clock, ManualClock)
    hooks = create_plugin_manager([], load_entrypoints=False).hook
    spec = consumer_spec(health_app.HealthTally)
    instance = Instance(db, [spec], SETTINGS, hooks, name="only")
    instance.start(loops=False)  # registers, declares, claims every partition
    worker = instance.workers[spec.name]
    assert set(_verdicts(db).values()) == {Verdict.CAUGHT_UP}

    with db.transaction() as conn:  # three messages of one source: one partition
        MessageStore(db).append(
            conn, health_app.TOPIC, "s", [health_app.Counted(n) for n in range(3)]
        )
    (busy,) = [p for p, v in _verdicts(db).items() if v == Verdict.LAGGING]
    clock.advance(STALL - 0.1)
    assert _verdicts(db)[busy] == Verdict.LAGGING
    clock.advance(0.2)
    assert _verdicts(db)[busy] == Verdict.STALLED
    assert health_report(db, SETTINGS)["status"] == Severity.DEGRADED

    instance.heartbeat()
    assert worker.poll() == 1  # a commit: progress, though the oldest message is older
    assert _verdicts(db)[busy] == Verdict.LAGGING
    clock.advance(STALL + 0.1)
    assert _verdicts(db)[busy] == Verdict.STALLED
    assert worker.poll() + worker.poll() == 2
    assert set(_verdicts(db).values()) == {Verdict.CAUGHT_UP}

    instance.heartbeat()
    clock.advance(STALE + 1.0)  # stale, but not for longer than the takeover may take
    assert set(_verdicts(db).values()) == {Verdict.CAUGHT_UP}
    clock.advance(0.1)
    assert set(_verdicts(db).values()) == {Verdict.UNOWNED}
    report = health_report(db, SETTINGS)
    assert report["status"] == Severity.CRITICAL
    assert (
        "its owner only was last heard 4.1 s ago"
        in report["consumers"][0]["partitions"][0]["reason"]
    )
    instance.heartbeat()
    assert set(_verdicts(db).values()) == {Verdict.CAUGHT_UP}

    operations.pause(db, spec.name, who="test")
    clock.advance(60.0)
    assert set(_verdicts(db).values()) == {Verdict.PAUSED}
    operations.resume(db, spec.name, who="test")  # released: nobody claims it here
    instance.heartbeat()
    clock.advance(STALE + 1.0)
    instance.heartbeat()
    assert set(_verdicts(db).values()) == {Verdict.CAUGHT_UP}
    clock.advance(0.1)
    instance.heartbeat()
    assert set(_verdicts(db).values()) == {Verdict.UNOWNED}
    instance.rebalance()
    assert set(_verdicts(db).values()) == {Verdict.CAUGHT_UP}
    instance.stop()
