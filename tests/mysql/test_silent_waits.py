"""Database waits on a connection that died without a word end within the answer bound,
and the watchdog frees a wait that no bound covers: MariaDB reached through a
:class:`SilentProxy` whose network freezes."""

from __future__ import annotations

import threading
import time

import pytest
from silent_proxy import SilentProxy
from sqlalchemy.exc import OperationalError

from messaging import Database
from messaging.runtime._watchdog import GRACE, Watchdog
from messaging.store._retry import is_ambiguous

pytestmark = pytest.mark.mysql


def _timed_select(db: Database) -> tuple[float, BaseException | None]:
    """Seconds a ``SELECT 1`` took, and its error."""
    started = time.monotonic()
    try:
        with db.read() as conn:
            conn.exec_driver_sql("SELECT 1").scalar()
    except Exception as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


@pytest.mark.parametrize("ending", ["thaw", "forget"])
def test_a_statement_on_a_silent_connection_fails_within_the_bound_and_the_pool_heals(
    db: Database, silent: SilentProxy, ending: str
) -> None:
    proxied = Database(silent.url(db.url), table_prefix=db.schema.prefix, answer_timeout=1.0)
    try:
        assert _timed_select(proxied)[1] is None  # a pooled connection exists
        silent.freeze()
        took, error = _timed_select(proxied)
        assert isinstance(error, OperationalError) and is_ambiguous(error), error
        assert 0.9 <= took <= 1.5, took
        took, error = _timed_select(proxied)  # a new connection: its greeting never comes
        assert isinstance(error, OperationalError) and took <= 1.5, (took, error)
        getattr(silent, ending)()
        took, error = _timed_select(proxied)
        assert error is None and took < 0.5, (took, error)  # no dead connection handed out
    finally:
        proxied.dispose()


def test_keepalive_and_timeouts_are_set_on_every_connection(db: Database) -> None:
    bounded = Database(db.url, table_prefix=db.schema.prefix, answer_timeout=6.0)
    try:
        with bounded.engine.connect() as conn:
            driver = conn.connection.dbapi_connection
            sock = driver._sock  # type: ignore[union-attr]
            import socket

            assert (driver._read_timeout, driver._write_timeout) == (6.0, 6.0)  # type: ignore[union-attr]
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 6000
        bounded.bound_answers(4.0)  # an instance's own bound: pooled connections replaced
        with bounded.engine.connect() as conn:
            assert conn.connection.dbapi_connection._read_timeout == 4.0  # type: ignore[union-attr]
    finally:
        bounded.dispose()
    unbounded = Database(db.url, table_prefix=db.schema.prefix, answer_timeout=None)
    try:
        with unbounded.engine.connect() as conn:
            assert conn.connection.dbapi_connection._read_timeout is None  # type: ignore[union-attr]
    finally:
        unbounded.dispose()


def test_the_watchdog_abandons_a_wait_that_no_bound_ends(db: Database, silent: SilentProxy) -> None:
    proxied = Database(silent.url(db.url), table_prefix=db.schema.prefix, answer_timeout=None)
    watchdog = Watchdog("instance test", answer_bound=lambda: 1.0)
    stop = threading.Event()
    looking = threading.Thread(target=watchdog.run, args=(stop,), daemon=True)
    try:
        assert _timed_select(proxied)[1] is None
        silent.freeze()
        looking.start()
        took, error = _timed_select(proxied)  # would wait for ever without the watchdog
        assert isinstance(error, OperationalError) and is_ambiguous(error), error
        assert 1.0 + GRACE <= took <= 1.0 + GRACE + 2.5, took
        silent.thaw()
        assert _timed_select(proxied)[1] is None
    finally:
        stop.set()
        silent.thaw()
        proxied.dispose()
