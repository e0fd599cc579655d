"""Randomly lost COMMIT acknowledgements under two real instance processes: while traffic
is appended, the proxy between the instances and MariaDB loses a share of all commits'
acknowledgements (batches, deadlines, claims, heartbeats, everything). Afterwards every
read model equals the sequential replay: nothing applied twice, reordered or lost; each
route consumer's effect once per job; each deadline delivered once; each sent message
stored once.

(MariaDB only: SQLite cannot lose an acknowledgement, see ``tests/faults/conftest.py``.)
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import fault_app
import pytest
from ack_proxy import AckProxy
from clusters import lag, start_instance, stop_instance, wait_until, write_config
from fault_model import SINGLE_OWNER, SOURCES, append_numbered, effects, message_ids, tally
from sqlalchemy import func, select

from messaging import Database, MessageStore

pytestmark = [pytest.mark.faults, pytest.mark.mysql, pytest.mark.multiprocess]

ROUNDS = 50
TIMERS = [f"timer-{i}" for i in range(20)]
DROP_PROBABILITY = 0.08


def _deadlines(db: Database) -> int:
    d = db.schema.deadlines
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(d)).scalar_one())


def _caught_up(db: Database, jobs: list[str]) -> bool:
    consumers = [*fault_app.PROJECTIONS, fault_app.GUARDED, fault_app.PLAIN, "fault-timers"]
    return (
        all(lag(db, name) == 0 for name in consumers)
        and _deadlines(db) == 0
        and len(effects(db, "fault-timers")) == len(TIMERS)
        and set(effects(db, fault_app.GUARDED)) == set(jobs)
        and set(effects(db, fault_app.PLAIN)) == set(jobs)
    )


def test_random_lost_acks_under_two_instances_equal_the_sequential_replay(
    db: Database, proxied: Database, proxy: AckProxy, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "config.yaml", proxied, batch_size=20, extra=SINGLE_OWNER)
    proxy.probability = DROP_PROBABILITY
    started = time.monotonic()
    instances = [
        start_instance(config, f"random-{n}", "fault_app", log=tmp_path / f"random-{n}.log")
        for n in (1, 2)
    ]
    store = MessageStore(db)
    with db.transaction() as conn:
        for n, timer in enumerate(TIMERS):
            due = time.time() + 1 + n * 0.2
            store.append(conn, fault_app.TIMERS, timer, [fault_app.TimerSet(timer, due)])
    for seq in range(1, ROUNDS + 1):
        append_numbered(db, SOURCES, seq, 1)
        time.sleep(0.05)  # traffic spread over the run, not a synchronisation
    appended = time.monotonic()
    jobs = [f"{s}:{seq}" for s in SOURCES for seq in range(5, ROUNDS + 1, 5)]
    wait_until(lambda: _caught_up(db, jobs), timeout=60, what="every consumer to catch up")
    caught_up = time.monotonic()
    proxy.probability = 0.0
    assert [stop_instance(process) for process in instances] == [0, 0]

    expected = dict.fromkeys(SOURCES, ROUNDS)
    tallies = {name: tally(db, name, expected) for name in fault_app.PROJECTIONS}
    handled = {
        name: effects(db, name) for name in (fault_app.GUARDED, fault_app.PLAIN, "fault-timers")
    }
    print(
        f"\ntraffic {appended - started:.1f}s, caught up {caught_up - appended:.1f}s later; "
        f"lost acknowledgements: {proxy.dropped} of {proxy.commits} commits; "
        + "; ".join(
            f"{name}: applied {t.applied} of {ROUNDS * len(SOURCES)}, duplicates {t.duplicates}, "
            f"reordered {t.reordered}, lost {t.lost}"
            for name, t in tallies.items()
        )
        + "; "
        + "; ".join(
            f"{name}: {len(done)} ids, {sum(done.values()) - len(done)} handled twice"
            for name, done in handled.items()
        )
    )
    assert proxy.dropped > 0
    for name, result in tallies.items():
        assert result.exact and result.applied == ROUNDS * len(SOURCES), (name, result)
    once = Counter(jobs)
    assert effects(db, fault_app.GUARDED) == once
    assert effects(db, fault_app.PLAIN) == once
    assert effects(db, "fault-timers") == Counter(TIMERS)
    for topic, count in [
        (fault_app.GUARDED, len(jobs)),
        (fault_app.PLAIN, len(jobs)),
        (fault_app.FIRED, len(TIMERS)),
    ]:
        sent = message_ids(db, topic)
        assert len(sent) == count and set(sent.values()) == {1}, (topic, sent)
