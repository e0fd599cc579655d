"""The pulse wakes idle workers: whatever the order of appends and missed beats, one good
beat after the last append gets every message applied. The workers run their real loops
(threads) and wait for news, under a pulse beaten by hand (same-host wake-ups are sent
elsewhere, and the instance's own beats come once an hour); the database is a real
SQLite file. A worker woken by nothing would sit for the stale-instance-timeout (30 s)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import attrs
import pytest
from clusters import wait_until
from effort import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messaging import HandlerContext, Instance, create_plugin_manager, handler, message
from messaging._config import settings_from_mapping
from messaging._consumers import collect_specs
from messaging.applying._polling import Worker
from messaging.store._database import Database
from messaging.store._store import MessageStore
from messaging.store._wakeup import WakeUps
from projections import projection
from projections.testing import scratch_database

TOPICS = ("pulse-a", "pulse-b")


@message("test.pulse.bit")
@attrs.define(frozen=True)
class Bit:
    n: int


@projection("pulse-a", topics="pulse-a", partitions=2)
class OnA:
    @handler
    def bit(self, bit: Bit, ctx: HandlerContext) -> None:
        pass


@projection("pulse-b", topics="pulse-b", partitions=2)
class OnB:
    @handler
    def bit(self, bit: Bit, ctx: HandlerContext) -> None:
        pass


@attrs.define
class Running:
    db: Database
    instance: Instance


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    """One instance whose workers run their loops under a pulse that only the test beats
    (a long idle-poll-interval keeps its own beats out of the way)."""
    config = {"messaging": {"consumer": {"idle-poll-interval": "1h", "rebalance-interval": "10s"}}}
    with scratch_database(None) as db:
        hooks = create_plugin_manager([], load_entrypoints=False).hook
        specs = collect_specs([OnA, OnB])
        instance = Instance(db, specs, settings_from_mapping(config), hooks, name="pulsed")
        instance.start()
        db.wakeups = WakeUps("appends of this test wake no one")
        try:
            yield Running(db, instance)
        finally:
            instance.stop()


def _caught_up(db: Database, worker: Worker) -> bool:
    return not _behind(db, worker)


def _behind(db: Database, worker: Worker) -> bool:
    claims = worker.claims()  # type: ignore[attr-defined]  # a ConsumerWorker
    with db.read() as conn:
        return bool(
            worker.store.read_batch(
                conn,
                worker.spec.topics,
                partitions={p: c.checkpoint for p, c in claims.items()},
                partition_count=worker.spec.partitions,
                types=worker.dispatcher.type_names,
                limit=1,
            )
        )


steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from(TOPICS)),
        st.tuples(st.just("beat"), st.booleans()),  # False: this beat is missed
    ),
    max_size=8,
)


@settings(
    max_examples=examples(20),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=steps)
def test_one_good_beat_after_the_last_append_gets_everything_applied(
    running: Running, steps: list[tuple[str, object]]
) -> None:
    db, instance = running.db, running.instance
    store = MessageStore(db)
    for n, (kind, arg) in enumerate(steps):
        if kind == "append":
            with db.transaction() as conn:
                store.append(conn, str(arg), f"s{n}", [Bit(n)])
        elif arg:
            instance.pulser.beat()
    instance.pulser.beat()
    for worker in instance.workers.values():
        wait_until(partial(_caught_up, db, worker), timeout=5, what=f"{worker.spec.name}")
