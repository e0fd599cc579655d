"""The MySQL sessions of this process, so that whoever takes over from a frozen instance
can end that instance's sessions: its row locks go at once and its late commits fail.

Each connection's id (``CONNECTION_ID()``) is recorded when the pool opens it, with its
server (``@@hostname:@@port``) and the server's start time (ids start again when the
server restarts, and each Galera node has its own), and forgotten when it is closed.
An instance publishes them with its registration and heartbeats (the ``sessions``
column, migration V8), and a heartbeat runs at once after a session opens
(:meth:`Sessions.on_open`), so that a session opened between heartbeats, perhaps the one
an instance freezes in holding row locks, is known within milliseconds (a short window
remains). No process ends a session it opened itself, so instances that run in one
process (tests, simulations) never end each other's.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import attrs
from sqlalchemy import Engine, event
from sqlalchemy.exc import DBAPIError

__all__ = ["Session", "Sessions", "parse_sessions"]

log = logging.getLogger("messaging.store.sessions")

_BOOT_TOLERANCE = 2
"""Seconds two readings of one server's start time may differ by (both are whole seconds)."""
_UNKNOWN_THREAD = 1094
"""MySQL's "unknown thread id": the session had ended already."""

_OWN: set[Session] = set()
"""The sessions opened by this process, on every engine."""
_OWN_LOCK = threading.Lock()


@attrs.frozen
class Session:
    """One MySQL session: its server, the server's start (Unix seconds) and its id."""

    server: str
    boot: int
    id: int

    def same_server(self, other: Session) -> bool:
        """Whether ``other`` runs on this session's server since the same start."""
        return self.server == other.server and abs(self.boot - other.boot) <= _BOOT_TOLERANCE


def parse_sessions(text: str | None) -> tuple[Session, ...]:
    """The sessions an instance row records (None: none, e.g. on SQLite)."""
    if not text:
        return ()
    return tuple(Session(str(s), int(b), int(i)) for s, b, i in json.loads(text))


class Sessions:
    """Tracks the sessions of one MySQL engine's pool, and ends other processes' ones."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._open: dict[int, Session] = {}  # by id() of the DB-API connection
        self._ended: set[Session] = set()
        self._refused = False
        self._wakes: weakref.WeakSet[threading.Event] = weakref.WeakSet()
        event.listen(engine, "connect", self._connected)
        event.listen(engine, "close", self._closed)
        event.listen(engine, "close_detached", self._closed)

    def on_open(self, wake: threading.Event) -> None:
        """Set ``wake`` after each new session opens (for as long as it exists)."""
        self._wakes.add(wake)

    def recorded(self) -> str:
        """The open sessions, as an instance row records them (JSON)."""
        sessions = sorted(self._open.copy().values(), key=attrs.astuple)
        return json.dumps([attrs.astuple(s) for s in sessions])

    def of(self, dbapi_connection: Any) -> Session | None:
        """The session of one of the engine's connections (None if unknown)."""
        return self._open.get(id(dbapi_connection))

    def end(self, sessions: Iterable[Session], owner: str) -> int:
        """End ``sessions`` (those of ``owner``, a stale instance) that run on the server
        this process talks to now and were not opened here nor ended before; return how
        many were ended. Where the server refuses (``KILL`` needs the same user or the
        CONNECTION ADMIN privilege), say so once and end nothing: the lock-wait bound then
        frees the waiters, more slowly."""
        if self._refused:
            return 0
        ended = 0
        with self.engine.connect() as conn:
            here = self._open.get(id(conn.connection.dbapi_connection))
            with _OWN_LOCK:
                others = [s for s in sessions if s not in _OWN and s not in self._ended]
            for session in others:
                if here is None or not here.same_server(session):
                    continue
                try:
                    conn.exec_driver_sql(f"KILL CONNECTION {int(session.id)}")
                except DBAPIError as exc:
                    code = next(iter(getattr(exc.orig, "args", ())), None)
                    if code != _UNKNOWN_THREAD:
                        self._refused = True
                        log.warning(
                            "cannot end the database sessions of stale instance %s (%s); its "
                            "locks stay until the lock-wait bound frees their waiters",
                            owner,
                            exc.orig,
                        )
                        return ended
                else:
                    ended += 1
                self._ended.add(session)
        return ended

    def _connected(self, dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT CONNECTION_ID(), @@hostname, @@port, UNIX_TIMESTAMP()")
            session_id, host, port, now = cursor.fetchone()
            cursor.execute("SHOW GLOBAL STATUS LIKE 'Uptime'")
            uptime = int(cursor.fetchone()[1])
        finally:
            cursor.close()
        session = Session(f"{host}:{port}", int(now) - uptime, int(session_id))
        self._open[id(dbapi_connection)] = session
        with _OWN_LOCK:
            _OWN.add(session)
        for wake in list(self._wakes):
            wake.set()

    def _closed(self, dbapi_connection: Any, _record: Any = None) -> None:
        session = self._open.pop(id(dbapi_connection), None)
        if session is not None:
            with _OWN_LOCK:
                _OWN.discard(session)
