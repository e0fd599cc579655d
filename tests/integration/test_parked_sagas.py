"""Real processes, both backends: a saga parks its instance on a failing message; the
instance's due deadlines wait with it while the other instances' are delivered, and once
it is retried its held messages are applied, then its deadlines delivered, exactly once
each and in order."""

from __future__ import annotations

import json
from pathlib import Path

import parked_saga_app as app
import pytest
from clusters import cli, lag, start_instance, stop_instance, wait_until, write_config
from sqlalchemy import func, select

from messaging import Database, MessageStore

pytestmark = pytest.mark.multiprocess

TRIPS = [f"trip-{n}" for n in range(8)]
POISONED = "trip-3"
EVERYTHING = ["leg-1", "leg-2", "leg-3", "alarm-a1", "alarm-a2"]


def _done(db: Database) -> dict[str, list[str]]:
    """Per trip, what its saga instance handled, in the order it committed."""
    with db.read() as conn:
        rows = MessageStore(db).read(conn, ["test-parked-done"], limit=100_000)
    found: dict[str, list[str]] = {}
    for row in rows:
        done = json.loads(row.payload)
        found.setdefault(done["trip_id"], []).append(done["what"])
    return found


def _deadlines(db: Database, key: str) -> int:
    d = db.schema.deadlines
    with db.read() as conn:
        return int(conn.execute(select(func.count()).where(d.c.saga_key == key)).scalar_one())


def _parked(config: Path) -> dict[str, int]:
    report = json.loads(cli(config, "parked", "parked-trips", "--json"))
    return {e["source"]: e["count"] for e in report["parked"]}


def test_a_parked_saga_keeps_its_due_deadlines_until_it_is_retried(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken"
    broken.touch()
    monkeypatch.setenv("PARKED_SAGA_BROKEN", str(broken))
    config = write_config(
        tmp_path / "config.yaml", db, batch_size=50, extra="sagas:\n  on-failure: park-source\n"
    )
    store = MessageStore(db)
    with db.read() as conn:
        now = float(conn.execute(select(db.clock.now())).scalar_one())
    with db.transaction() as conn:  # one batch: the poisoned trip parks with its deadlines
        for trip in TRIPS:
            legs = [app.Leg(trip, 1, alarm_at=now + 1), app.Leg(trip, 2, trip == POISONED)]
            store.append(conn, "trips", trip, legs)

    process = start_instance(config, "s1", "parked_saga_app")
    try:
        others = [t for t in TRIPS if t != POISONED]
        wait_until(
            lambda: all(len(_done(db).get(t, ())) == 4 for t in others),
            timeout=60,
            what="the other trips' legs and alarms",
        )
        # every alarm was due, the parked instance's wait with it
        assert _done(db)[POISONED] == ["leg-1"]
        assert _parked(config) == {POISONED: 1}
        assert _deadlines(db, POISONED) == 2
        with db.transaction() as conn:
            for trip in TRIPS:
                store.append(conn, "trips", trip, [app.Leg(trip, 3)])
        wait_until(lambda: lag(db, "parked-trips") == 0, timeout=60, what="the third legs")
        assert _parked(config) == {POISONED: 2}  # its third leg is held behind the second

        broken.unlink()  # the handler is fixed
        out = cli(config, "retry", "parked-trips", "--source", POISONED, "--reason", "fixed")
        assert out == f"retrying 1 parked sources of parked-trips: {POISONED}\n"
        wait_until(
            lambda: _deadlines(db, POISONED) == 0 and not _parked(config),
            timeout=60,
            what="the retry and the deadlines",
        )
    finally:
        assert stop_instance(process) == 0
    # Exactly once each, the held legs in order before the deadlines that waited for them.
    assert _done(db) == {
        t: EVERYTHING if t == POISONED else ["leg-1", "leg-2", "alarm-a1", "alarm-a2", "leg-3"]
        for t in TRIPS
    }
