"""A saga's reply recorded before its deadline fell due is applied first, in real processes
killed with SIGKILL on the way: no deadline is delivered while a message of its partition
recorded before its due time is unapplied (see the module of ``sagas._worker``).

Orders come at about 100 a second to two instances of :mod:`fulfilment_app`. The
warehouse's reply (``StockReserved``) comes a few tenths of a second after its order, and
the reservations expire over the same range (their due times are spread per order), so a
good share of the replies are recorded shortly before their deadline falls due, and are
still on their way to the saga then: the race a deadline must lose. One instance is
killed twice meanwhile (and started again), so partitions also move with due deadlines
and unapplied replies behind their checkpoints.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import fulfilment_app as app
import pytest
from clusters import owned_by, start_instance, stop_instance, wait_until, write_config
from forked import Process
from sqlalchemy import MetaData, func, select

from messaging import Database, MessageStore

pytestmark = pytest.mark.multiprocess

ORDERS = 2000
RATE = 100.0
"""Orders a second."""
PER_TRANSACTION = 5
"""Orders appended in one transaction."""
KILLS = (ORDERS // 3, 2 * ORDERS // 3)
"""After how many orders an instance is killed (and another started in its place)."""
ENV = {
    # due 5-800 ms after the order: where replies come on both backends, even under load
    # (on SQLite within tens of ms, its route consumers' handlers not holding the lock)
    "FULFILMENT_DEADLINE": "0.005",
    "FULFILMENT_DEADLINE_SPREAD": "0.8",
    "FULFILMENT_WAREHOUSE_DELAY": "0.003",
}
FEW = 5
"""Each outcome at least this often, or the run did not make replies race deadlines."""


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [app.metadata]


def _ended(db: Database) -> int:
    s = db.schema.sagas
    query = select(func.count()).where(s.c.tenant == db.tenant, s.c.saga == app.SAGA, s.c.ended)
    with db.read() as conn:
        return int(conn.execute(query).scalar_one())


def _recorded(db: Database) -> int:
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(app.outcomes_table)).scalar_one())


def _shared(db: Database, consumer: str) -> bool:
    """Every partition of ``consumer`` owned, by f1 or f2, each owning some."""
    owners = owned_by(db, {"f1", "f2"}, consumer)
    return owners is not None and set(owners.values()) == {"f1", "f2"}


def _done(db: Database) -> bool:
    """Every order's saga ended and its outcome recorded by the ``outcomes`` consumer."""
    return _ended(db) >= ORDERS and _recorded(db) >= ORDERS


def _kill_and_replace(processes: dict[str, Process], victim: str, name: str, config: Path) -> None:
    """SIGKILL ``victim`` and start ``name`` in its place (the other one runs on)."""
    process = processes.pop(victim)
    process.kill()
    process.wait(timeout=10)
    processes[name] = start_instance(config, name, "fulfilment_app", env=ENV)


def test_replies_recorded_before_a_deadline_fell_due_beat_it(db: Database, tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", db, batch_size=20)
    processes = {
        name: start_instance(config, name, "fulfilment_app", env=ENV) for name in ("f1", "f2")
    }
    started = time.monotonic()
    store = MessageStore(db)
    kills = 0
    try:
        wait_until(
            lambda: _shared(db, app.SAGA) and _shared(db, app.WAREHOUSE),
            timeout=60,
            what="both instances to share the saga and the warehouse",
        )
        begun = time.monotonic()
        for first in range(0, ORDERS, PER_TRANSACTION):
            if kills < len(KILLS) and first >= KILLS[kills]:  # f1 first, then f2
                victim = ("f1", "f2")[kills]
                _kill_and_replace(processes, victim, f"{victim}-again", config)
                kills += 1
            with db.transaction() as conn:
                for n in range(first, first + PER_TRANSACTION):
                    store.append(conn, app.TOPIC, f"o{n:05d}", [app.OrderPlaced(f"o{n:05d}")])
            pause = begun + (first + PER_TRANSACTION) / RATE - time.monotonic()
            if pause > 0:  # pacing: RATE orders a second on average (a late batch catches up)
                time.sleep(pause)
        wait_until(lambda: _done(db), timeout=120, what="every order's outcome")
    finally:
        codes = {name: stop_instance(process) for name, process in processes.items()}
    assert codes == {"f1-again": 0, "f2-again": 0}
    seconds = time.monotonic() - started

    m, s = db.schema.messages, db.schema.sagas
    with db.read() as conn:
        due = {
            key: float(json.loads(state)["due_at"])
            for key, state in conn.execute(
                select(s.c.saga_key, s.c.state).where(s.c.tenant == db.tenant, s.c.saga == app.SAGA)
            )
        }
        replies = conn.execute(
            select(m.c.source, m.c.recorded_at).where(
                m.c.tenant == db.tenant,
                m.c.topic == app.TOPIC,
                m.c.type == "test-fulfilment-app.stock-reserved",
            )
        ).all()
        outcomes = store.read(conn, [app.OUTCOMES], limit=10 * ORDERS)
        recorded = dict(
            conn.execute(select(app.outcomes_table.c.order_id, app.outcomes_table.c.shipped)).all()
        )
    orders = {f"o{n:05d}" for n in range(ORDERS)}
    assert set(due) == orders

    replied: dict[str, float] = {}  # order → when its (first) reply was recorded
    for order, at in replies:
        replied[order] = min(float(at), replied.get(order, float("inf")))
    told = [(json.loads(row.payload), float(row.recorded_at)) for row in outcomes]
    counts = Counter(outcome["order_id"] for outcome, _ in told)
    assert set(counts) == orders
    assert not {order: n for order, n in counts.items() if n != 1}, "orders with several outcomes"
    shipped = {outcome["order_id"]: bool(outcome["shipped"]) for outcome, _ in told}
    outcome_at = {outcome["order_id"]: at for outcome, at in told}  # when the saga ended
    assert {order: bool(ok) for order, ok in recorded.items()} == shipped  # all handled

    expired = sorted(order for order, ok in shipped.items() if not ok)
    overtaken = [order for order in expired if replied.get(order, float("inf")) < due[order]]
    # shipped although the deadline fell due before the saga applied the reply: held back
    held_back = [o for o, ok in shipped.items() if ok and replied[o] < due[o] < outcome_at[o]]
    print(
        f"\n{db.engine.dialect.name}: {ORDERS} orders, {len(shipped) - len(expired)} shipped, "
        f"{len(expired)} expired ({len(overtaken)} before an earlier reply), "
        f"{len(held_back)} deadlines held back behind a reply, {kills} kills, {seconds:.1f} s"
    )
    details = [(o, f"reply {replied[o]:.6f}", f"due {due[o]:.6f}") for o in overtaken[:10]]
    assert not overtaken, f"{len(overtaken)} deadlines overtook an earlier reply: {details}"
    assert len(expired) >= FEW and len(shipped) - len(expired) >= FEW, "no race: tune the app"
    assert len(held_back) >= FEW, "no reply was on its way when its deadline fell due"
