"""A MySQL/MariaDB database given as several nodes (a Galera cluster): one URL, several hosts.

``mysql://user@host1:3306,host2:3306,host3:3306/db`` names the nodes of one multi-primary
cluster, tried in that order (the MariaDB Connector/J "sequential" style). A new connection
goes to the node the last one went to; when that node refuses, or answers but is not ready
(``wsrep_ready=OFF``: joining, or cut off from the primary component), the next node is
tried, and so on round the list. A statement that fails because its node went away (lost
connection) or left the primary component (errors 1047, 1180) invalidates the connection
pool and moves the next connection on. Every move is logged in one line.

A connection made after a move first waits until its node has applied every transaction
the cluster committed before (one causal read, ``wsrep_sync_wait``), so an instance reads
its own last writes on the node it moved to. Correctness does not depend on it (a write
computed from a stale read fails Galera's certification, error 1213, and is retried), but
it spares those retries.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext

from messaging._errors import ConfigError

__all__ = ["NOT_PRIMARY", "Failover", "join_hosts", "split_hosts"]

log = logging.getLogger("messaging.store.nodes")

NOT_PRIMARY = {
    1047,  # WSREP has not yet prepared node for application use
    1180,  # got error 6 "No such device or address" during COMMIT: not in the primary component
}
"""MariaDB Galera errors of a node that is not part of the primary component."""

_HOSTS = re.compile(r"^(?P<head>[^:/]+://(?:[^/]*@)?)(?P<hosts>[^/?]*,[^/?]*)(?P<tail>[/?].*)?$")
_ONE_HOST = re.compile(r"^(?P<head>[^:/]+://(?:[^/]*@)?)(?P<host>[^/?]*)(?P<tail>.*)$")
_NODE = "projections_node"


def split_hosts(url: str) -> tuple[str, list[tuple[str, int | None]]]:
    """``(url naming only the first host, [(host, port), ...])`` of a URL with several
    hosts; ``(url, [])`` for a URL with one. :class:`ConfigError` for an empty host or a
    bad port."""
    match = _HOSTS.match(url)
    if match is None:
        return url, []
    nodes: list[tuple[str, int | None]] = []
    for item in match["hosts"].split(","):
        host, _, port = item.strip().partition(":")
        if not host or (port and not (port.isdigit() and 1 <= int(port) <= 65535)):
            raise ConfigError(
                f"invalid database URL {url!r}: {item.strip()!r} is not host or host:port "
                "(a port is a number 1-65535)"
            )
        nodes.append((host, int(port) if port else None))
    first = match["hosts"].split(",")[0].strip()
    return f"{match['head']}{first}{match['tail'] or ''}", nodes


def join_hosts(url: str, nodes: list[tuple[str, int | None]]) -> str:
    """``url`` (one host) with its host replaced by all of ``nodes``: the inverse of
    :func:`split_hosts`."""
    if not nodes:
        return url
    match = _ONE_HOST.match(url)
    assert match is not None, url
    hosts = ",".join(host if port is None else f"{host}:{port}" for host, port in nodes)
    return f"{match['head']}{hosts}{match['tail']}"


def _name(node: tuple[str, int | None]) -> str:
    return node[0] if node[1] is None else f"{node[0]}:{node[1]}"


class Failover:
    """Connects an engine to the first ready node of ``nodes``, starting from the last good
    one, and moves on when a node fails (see the module docstring)."""

    def __init__(self, nodes: list[tuple[str, int | None]]) -> None:
        self.nodes = nodes
        self.current = 0
        """Index of the node new connections try first."""
        self._using: int | None = None
        self._errors: list[str] = []
        """Why connections to the node in use failed since the last move (for its log)."""
        self._lock = threading.Lock()

    def install(self, engine: Engine) -> None:
        """Make ``engine`` connect through this failover list."""
        event.listen(engine, "do_connect", self._connect)
        event.listen(engine, "handle_error", self._on_error)

    def _connect(self, dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        with self._lock:
            start = self.current
        failures: list[str] = []
        error: BaseException | None = None
        for step in range(len(self.nodes)):
            index = (start + step) % len(self.nodes)
            host, port = self.nodes[index]
            params = {**cparams, "host": host, **({"port": port} if port else {})}
            try:
                connection = dialect.connect(*cargs, **params)
            except dialect.loaded_dbapi.Error as exc:
                failures.append(f"{_name(self.nodes[index])}: {exc}")
                error = exc
                continue
            ready = _wsrep_ready(connection)
            if ready is False:
                connection.close()
                reason = "wsrep_ready=OFF (not in the primary component or still joining)"
                failures.append(f"{_name(self.nodes[index])}: {reason}")
                error = dialect.loaded_dbapi.OperationalError(1047, reason)
                continue
            record.info[_NODE] = index
            if self._arrived(index, failures) and ready:
                _causal_wait(connection)
            return connection
        assert error is not None
        raise error

    def _arrived(self, index: int, failures: list[str]) -> bool:
        """Note that connections now go to node ``index``; whether that is a move."""
        with self._lock:
            previous, self._using, self.current = self._using, index, index
            errors, self._errors = self._errors, []
        if previous is None or previous == index:
            return False
        log.warning(
            "database node %s unavailable (%s); now using %s",
            _name(self.nodes[previous]),
            "; ".join([*errors, *failures]) or "?",
            _name(self.nodes[index]),
        )
        return True

    def _on_error(self, context: ExceptionContext) -> None:
        code = next(iter(getattr(context.original_exception, "args", ())), None)
        if code in NOT_PRIMARY:
            context.is_disconnect = True  # invalidate the pool: reconnect elsewhere
        if not context.is_disconnect or context.connection is None:
            return
        try:
            index = context.connection.info.get(_NODE)
        except Exception:  # an invalidated connection may not tell its node any more
            return
        error = str(context.original_exception).splitlines()[0]
        with self._lock:
            if index is not None and len(self._errors) < 3:
                self._errors.append(f"{_name(self.nodes[index])}: {error}")
            if index is not None and index == self.current:
                self.current = (index + 1) % len(self.nodes)


def _wsrep_ready(connection: Any) -> bool | None:
    """Whether the Galera node behind a fresh connection is ready (``wsrep_ready``); None
    when the server is not a Galera node."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW VARIABLES LIKE 'wsrep_on'")
        row = cursor.fetchone()
        if row is None or str(row[1]).upper() != "ON":
            return None
        cursor.execute("SHOW STATUS LIKE 'wsrep_ready'")
        row = cursor.fetchone()
    return row is not None and str(row[1]).upper() == "ON"


def _causal_wait(connection: Any) -> None:
    """Wait until the node has applied everything the cluster committed so far."""
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION wsrep_sync_wait = 1")
        cursor.execute("SELECT 1 FROM information_schema.ENGINES LIMIT 1")
        cursor.execute("SET SESSION wsrep_sync_wait = 0")
