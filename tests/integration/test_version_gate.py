"""When a version being built asks for the next cutover step: near its end after progress,
and once when its live version stops; never again for idle polls with nothing changed
(a paused live version or a held swap would otherwise get a rebalance round per poll)."""

from __future__ import annotations

import json

from sqlalchemy import insert, update

from messaging import Database
from messaging._states import ConsumerState
from messaging.versions._gate import VersionGate

BATCH = 100
LIVE = "gate-balances"


def _polls(db: Database, gate: VersionGate, applied: list[int]) -> list[bool]:
    """Whether each poll, after reading the live version as a poll does, asks for a step."""
    asked = []
    for count in applied:
        with db.read() as conn:
            gate.read(conn)
        asked.append(gate.due(count, BATCH))
    return asked


def test_idle_polls_ask_for_a_step_once_per_change(db: Database) -> None:
    consumers = db.schema.consumers
    with db.transaction() as conn:
        conn.execute(
            insert(consumers).values(
                tenant=db.tenant,
                name=LIVE,
                kind="projection",
                distribution="partitioned",
                partitions=2,
                topics="[]",
                types="[]",
                fingerprint="f" * 16,
                state=ConsumerState.RUNNING,
                updated_at=0,
            )
        )
    gate = VersionGate(db, LIVE)
    # catching up: full batches ask nothing; near the end once, then after progress only
    asked = _polls(db, gate, [BATCH, BATCH, 0, 0, 0, 5, 0, BATCH, 0])
    assert asked == [False, False, True, False, False, True, False, False, True]
    with db.transaction() as conn:  # the live version stops for the cutover
        stop = {"checkpoints": {"0": 0, "1": 0}, "partitions": 2}
        conn.execute(
            update(consumers).where(consumers.c.name == LIVE).values(cutover=json.dumps(stop))
        )
    assert gate.stopped is False
    assert _polls(db, gate, [0, 0, 7, 0, 0]) == [True, False, True, False, False]
    assert gate.stopped is True
