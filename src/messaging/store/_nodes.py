"""A MySQL/MariaDB database given as several nodes (a Galera cluster): one URL, several hosts.

``mysql://user@host1:3306,host2:3306,host3:3306/db`` names the nodes of one multi-primary
cluster, tried in that order (the MariaDB Connector/J "sequential" style). A new connection
goes to the node the last one went to; when that node refuses, or answers but is not ready
(``wsrep_ready=OFF``: joining, or cut off from the primary component), the next node is
tried, and so on round the list. A statement that fails because its node went away (lost
connection, or no answer within the answer bound) or left the primary component (errors
1047, 1180) invalidates the connection pool and moves the next connection on; a connection
that reaches a node only after the list has moved on from it (a frozen node answering once
it resumes, before it knows its cluster evicted it) is closed, and the list followed. Every
move is logged in one line.

A connection made after a move first waits until its node has applied every transaction
the cluster committed before (one causal read, ``wsrep_sync_wait``), so an instance reads
its own last writes on the node it moved to. Correctness does not depend on it (a write
computed from a stale read fails Galera's certification, error 1213, and is retried), but
it spares those retries.

While a cluster evicts a member that fell silent, its other nodes hold every commit (and
causal read) for up to :func:`eviction_time`; the connections' answer bound is never
shorter (:mod:`messaging.store._answers`), so a healthy node is not taken for dead then.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext

from messaging._errors import ConfigError

__all__ = ["NOT_PRIMARY", "Failover", "eviction_time", "join_hosts", "split_hosts"]

log = logging.getLogger("messaging.store.nodes")

NOT_PRIMARY = {
    1047,  # WSREP has not yet prepared node for application use
    1180,  # got error 6 "No such device or address" during COMMIT: not in the primary component
}
"""MariaDB Galera errors of a node that is not part of the primary component."""

_HOSTS = re.compile(r"^(?P<head>[^:/]+://(?:[^/]*@)?)(?P<hosts>[^/?]*,[^/?]*)(?P<tail>[/?].*)?$")
_ONE_HOST = re.compile(r"^(?P<head>[^:/]+://(?:[^/]*@)?)(?P<host>[^/?]*)(?P<tail>.*)$")
_NODE = "projections_node"
_MOVED = "projections_moved"
_DURATION = re.compile(
    r"^P(?:(?P<D>[\d.]+)D)?(?:T(?:(?P<H>[\d.]+)H)?(?:(?P<M>[\d.]+)M)?(?:(?P<S>[\d.]+)S)?)?$"
)
_SECONDS = {"D": 86400.0, "H": 3600.0, "M": 60.0, "S": 1.0}


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


def _at(cparams: dict[str, Any], node: tuple[str, int | None]) -> dict[str, Any]:
    """Connection parameters ``cparams`` pointed at ``node``."""
    host, port = node
    return {**cparams, "host": host, **({"port": port} if port else {})}


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
        """Make ``engine`` connect through this failover list (after the answer bound's
        listeners: the causal wait after a move waits as long as any statement may)."""
        event.listen(engine, "do_connect", self._connect)
        event.listen(engine, "connect", self._after_move)
        event.listen(engine, "handle_error", self._on_error)

    def follow(self, engine: Engine) -> None:
        """Make ``engine`` connect only to the node in use, never moving the list: the
        engine it was installed on leads (a move is said, and waited for, once)."""
        event.listen(engine, "do_connect", self._connect_current)

    def _connect_current(
        self, dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]
    ) -> Any:
        with self._lock:
            node = self.nodes[self.current]
        return dialect.connect(*cargs, **_at(cparams, node))

    def _connect(self, dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        with self._lock:
            start = self.current
        failures: list[str] = []
        error: BaseException | None = None
        step, followed = 0, False
        while step < len(self.nodes):
            index = (start + step) % len(self.nodes)
            step += 1
            try:
                connection = dialect.connect(*cargs, **_at(cparams, self.nodes[index]))
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
            with self._lock:
                current = self.current
            if current not in (start, index) and not followed:
                # The list moved on while this connection was made (a frozen node that
                # answered once it resumed, not knowing yet that its cluster evicted it):
                # follow the list rather than lead it back.
                connection.close()
                start, step, followed = current, 0, True
                continue
            record.info[_NODE] = index
            record.info[_MOVED] = self._arrived(index, failures) and ready
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

    def _after_move(self, dbapi_connection: Any, record: Any) -> None:
        if record.info.pop(_MOVED, False):
            _causal_wait(dbapi_connection)

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


def eviction_time(connection: Any) -> float | None:
    """Seconds the Galera node behind a DB-API connection may hold every commit while its
    cluster evicts a member that fell silent: ``evs.suspect_timeout`` (until the others
    suspect it) + ``evs.install_timeout`` (to agree on the membership without it); 12.5 s at
    Galera's defaults. None when the server is not a Galera node."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW VARIABLES LIKE 'wsrep_provider_options'")
        row = cursor.fetchone()
    items = (item.partition("=") for item in str(row[1] if row else "").split(";"))
    options = {key.strip(): value.strip() for key, _, value in items}
    try:
        return _duration(options["evs.suspect_timeout"]) + _duration(options["evs.install_timeout"])
    except (KeyError, ValueError):
        return None


def _duration(text: str) -> float:
    """Seconds of an ISO 8601 duration as Galera writes them (``PT5S``, ``PT0.5S``, ``PT1M``)."""
    match = _DURATION.match(text)
    if match is None or not any(match.groupdict().values()):
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(v) * _SECONDS[unit] for unit, v in match.groupdict().items() if v)


def _causal_wait(connection: Any) -> None:
    """Wait until the node has applied everything the cluster committed so far."""
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION wsrep_sync_wait = 1")
        cursor.execute("SELECT 1 FROM information_schema.ENGINES LIMIT 1")
        cursor.execute("SET SESSION wsrep_sync_wait = 0")
