"""How long a MySQL/MariaDB connection waits for its server before taking it for dead.

A connection can die without a word: a NAT gateway, a firewall or a load balancer forgets
it, a virtual IP moves, a Galera node freezes with its sockets open. Nothing closes the
client's side, and PyMySQL waits without a timeout by default, so a thread reading it would
wait for ever. Here every connection of an engine is bounded:

- connecting, and each read and write on the socket, give up after the bound (PyMySQL's
  ``connect_timeout``, ``read_timeout`` and ``write_timeout``): the statement fails with
  "lost connection" (2013), an error of unknown outcome that the callers retry after
  re-reading (:mod:`messaging.store._retry`), and SQLAlchemy invalidates the pool, so no
  connection opened before it is handed out again;
- TCP keepalive probes find a dead peer of an idle pooled connection within the bound,
  and unacknowledged writes end it after the bound (``TCP_USER_TIMEOUT``, on Linux).

The bound is long enough for any statement the framework sends: above the lock-wait bound
(:func:`messaging.store._database.lock_wait_bound`), after which the server itself ends a
statement waiting for a lock. A user's statement inside a batch shares it. On a Galera node
it is at least the cluster's eviction time (:func:`~messaging.store._nodes.eviction_time`,
read from the first connection): while the cluster evicts a member that fell silent, a
healthy node holds every commit that long, and must not be taken for dead meanwhile.
"""

from __future__ import annotations

import socket
from typing import Any

from sqlalchemy import Engine, event

from messaging.store._nodes import eviction_time

__all__ = ["AnswerBound"]

_PROBES = 2
"""Keepalive probes without an answer before the kernel ends the connection."""


class AnswerBound:
    """Bounds every connection an engine opens from now on to :attr:`longest` per wait."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        """The bound asked for (None: no bound)."""
        self.eviction: float | None = None
        """The Galera cluster's eviction time (0: not a Galera node; None: not known yet)."""

    @property
    def longest(self) -> float | None:
        """Seconds a connection waits for an answer: :attr:`seconds`, or the cluster's
        eviction time where that is longer (None: for ever)."""
        if self.seconds is None:
            return None
        return max(self.seconds, self.eviction or 0.0)

    def install(self, engine: Engine) -> None:
        """Apply the bound to ``engine``'s new connections. Install it before any other
        ``do_connect`` listener (a failover list's, the TLS skip): those connect with the
        parameters as they find them."""
        event.listen(engine, "do_connect", self._bounded_parameters)
        event.listen(engine, "connect", self._connected)

    def _bounded_parameters(
        self, _dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]
    ) -> None:
        seconds = self.longest
        if seconds is None:
            return
        # Equal read and write timeouts: PyMySQL then never resets the socket's timeout
        # between a write and the read of its answer.
        cparams.update(connect_timeout=seconds, read_timeout=seconds, write_timeout=seconds)

    def _connected(self, dbapi_connection: Any, _record: Any) -> None:
        if self.seconds is None:
            return
        if self.eviction is None:  # the engine's first connection: ask the server once
            self.eviction = eviction_time(dbapi_connection) or 0.0
        seconds = self.longest
        if getattr(dbapi_connection, "_read_timeout", seconds) != seconds:  # opened before
            dbapi_connection._read_timeout = dbapi_connection._write_timeout = seconds
        self._keep_alive(dbapi_connection)

    def _keep_alive(self, dbapi_connection: Any) -> None:
        sock = getattr(dbapi_connection, "_sock", None)  # PyMySQL's socket
        seconds = self.longest
        if seconds is None or not isinstance(sock, socket.socket):
            return
        if sock.family == socket.AF_UNIX:
            return
        idle = max(1, int(seconds / (_PROBES + 1)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (
            ("TCP_KEEPIDLE", idle),
            ("TCP_KEEPINTVL", idle),
            ("TCP_KEEPCNT", _PROBES),
            ("TCP_USER_TIMEOUT", int(seconds * 1000)),
        ):
            if hasattr(socket, option):  # Linux has them all; other systems some
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
