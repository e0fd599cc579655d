"""A session opened between heartbeats is recorded in the instance row at once (a quarter
heartbeat-interval at most), not at the next heartbeat: it may be the one the instance
freezes in holding row locks, which the instance taking over must know to end."""

from __future__ import annotations

import fault_app
import pytest
from clusters import wait_until
from sqlalchemy import select

from messaging import Database, Instance, Settings, create_plugin_manager
from messaging._consumers import consumer_spec
from messaging._settings import ConsumerSettings, MessagingSettings
from messaging.store._sessions import parse_sessions

pytestmark = pytest.mark.mysql

INTERVAL = 4.0


def _row(db: Database, instance_id: str) -> tuple[float, set[int]]:
    """The instance's last heartbeat and the ids of the sessions its row records."""
    t = db.schema.instances
    with db.read() as conn:
        beat, text = conn.execute(
            select(t.c.heartbeat_at, t.c.sessions).where(t.c.id == instance_id)
        ).one()
    return float(beat), {s.id for s in parse_sessions(text)}


def test_a_new_session_is_recorded_within_a_quarter_interval(db: Database) -> None:
    own = Database(db.url, table_prefix=db.schema.prefix)
    consumer = ConsumerSettings(heartbeat_interval=INTERVAL, stale_instance_timeout=3 * INTERVAL)
    settings = Settings(messaging=MessagingSettings(consumer=consumer))
    manager = create_plugin_manager([], load_entrypoints=False)
    instance = Instance(own, [consumer_spec(fault_app.SingleSequence)], settings, manager.hook)
    instance.start()
    try:
        first, _ = _row(db, instance.id)
        wait_until(lambda: _row(db, instance.id)[0] > first, timeout=2 * INTERVAL, what="a beat")
        # One more connection than the pool holds idle: at least one opens a new session.
        held = [own.engine.connect() for _ in range(own.engine.pool.checkedin() + 1)]  # type: ignore[attr-defined]
        try:
            ids = {c.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one() for c in held}
            wait_until(
                lambda: ids <= _row(db, instance.id)[1],
                timeout=INTERVAL / 2,
                what="the new session to be recorded before the next regular heartbeat",
            )
        finally:
            for conn in held:
                conn.close()
    finally:
        instance.stop()
        own.dispose()
