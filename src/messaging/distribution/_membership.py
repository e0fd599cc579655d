"""Instances: registration, heartbeats stamped by the database clock, and who is live.

An instance is live while its heartbeat is younger than ``stale-instance-timeout``,
compared in SQL against the same clock that stamped it, and until a peer sees its
liveness signal let go (:mod:`messaging.store._liveness`) and declares it gone, which
ages its heartbeat past the timeout at once. Rows of instances that died
without a clean stop are deleted once they are far older than that (see
:meth:`Membership.remove_stale`), so the table does not grow with every crash.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

import attrs
from sqlalchemy import (
    Connection,
    Float,
    Select,
    Table,
    bindparam,
    case,
    delete,
    insert,
    select,
    type_coerce,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import NullType

from messaging.store import _fastpath
from messaging.store._built import per_table
from messaging.store._clock import Clock, cached_now, now_params
from messaging.store._database import Database
from messaging.store._liveness import STALE, Signal, gone_reason, signal_for
from messaging.store._retry import is_unreachable
from messaging.store._sessions import Session, parse_sessions

log = logging.getLogger("messaging.distribution.membership")

STALE_ROW_RETENTION_FACTOR = 10
"""A dead instance's row is deleted once its heartbeat is this many stale-instance-timeouts old
(and at least :data:`MIN_STALE_ROW_RETENTION`): long after every report showed it stale."""
MIN_STALE_ROW_RETENTION = 60.0
"""Seconds a stale row is kept at the least, whatever the stale-instance-timeout."""
STALE_ROW_PURGE_INTERVAL = 60.0
"""Seconds between two purges of stale rows by one instance (the first comes at once)."""


def stale_row_retention(stale_timeout: float) -> float:
    """Seconds after its last heartbeat that a dead instance's row is deleted."""
    return max(STALE_ROW_RETENTION_FACTOR * stale_timeout, MIN_STALE_ROW_RETENTION)


@attrs.define(frozen=True, kw_only=True)
class InstanceInfo:
    """What an instance says about itself in its row."""

    id: str
    name: str
    host: str
    pid: int
    runs: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    """Consumer name → {"distribution": ..., "fingerprint": ...}."""


@attrs.define(frozen=True, kw_only=True)
class InstanceRow:
    """An instance as the database records it."""

    id: str
    name: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    stopping: bool
    live: bool
    runs: Mapping[str, Mapping[str, Any]]
    expires_in: float = 0.0
    """Seconds until it counts as stale unless it heartbeats again (database clock)."""
    sessions: tuple[Session, ...] = ()
    """Its MySQL sessions, as of its last heartbeat."""
    liveness: str | None = None
    """Its liveness signal, or why a peer declared it gone (JSON; None: no signal)."""

    def declares(self, consumer: str, stale: Collection[str] = ()) -> bool:
        """Whether its code declares ``consumer`` (or, for a version ``name@N``, ``name``):
        it runs the consumer or a version of it, or holds a declaration of it that the
        database replaced (``stale``, what it published: it applies nothing of those)."""
        name = consumer.partition("@")[0]
        return name in stale or any(c.partition("@")[0] == name for c in self.runs)

    @property
    def gone_because(self) -> str | None:
        """Why it is not live: its process was seen gone, or its heartbeat is stale."""
        return None if self.live else gone_reason(self.liveness) or STALE


def stale_of(published: Mapping[str, Mapping[str, Any]], instance_id: str) -> dict[str, float]:
    """What instance ``instance_id`` published (``published``: :meth:`Membership.in_memory`)
    of the consumers its code declares and does not run: name → the database time since."""
    stale = published.get(instance_id, {}).get("stale", {})
    return dict(stale) if isinstance(stale, Mapping) else {}


class Membership:
    """Reads and writes the ``instances`` table of one tenant."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = db.schema.instances
        self._next_purge = 0.0  # time.monotonic() of the next due purge
        self.signal = Signal()
        """This instance's liveness signal, once :meth:`hold` took it."""
        self._runs: dict[str, Mapping[str, Mapping[str, Any]]] = {}
        """Each ``runs`` text :meth:`instances` read lately, parsed (shared: never mutated)."""
        self._sessions: dict[str | None, tuple[Session, ...]] = {}
        """Each ``sessions`` text :meth:`instances` read lately, parsed."""

    def hold(self, instance_id: str, interval: float) -> None:
        """Take this instance's liveness signal (before registering); its MySQL lock
        checks the peers' every ``interval`` seconds."""
        signal = signal_for(self.db, instance_id, interval)
        try:
            signal.hold()
        except BaseException:
            signal.close()
            raise
        self.signal = signal

    def let_go(self) -> None:
        """Let this instance's liveness signal go (once it has left)."""
        self.signal.close()
        self.signal = Signal()

    def _published(self) -> dict[str, str | None]:
        """This process's MySQL sessions (none on SQLite) and liveness signal, for its row."""
        sessions = self.db.sessions
        published = {} if sessions is None else {"sessions": sessions.recorded()}
        return {**published, "liveness": self.signal.describe()}

    def register(self, conn: Connection, info: InstanceInfo) -> None:
        """Insert this instance's row, stamped now (its first heartbeat)."""
        now = self.db.clock.now()
        conn.execute(
            insert(self.table).values(
                tenant=self.db.tenant,
                id=info.id,
                name=info.name,
                host=info.host,
                pid=info.pid,
                started_at=now,
                heartbeat_at=now,
                stopping=False,
                runs=json.dumps(info.runs, sort_keys=True),
                **self._published(),
            )
        )

    def heartbeat(
        self, conn: Connection, instance_id: str, stale_timeout: float, *, stopping: bool = False
    ) -> str:
        """Stamp the heartbeat (and record this process's sessions and liveness signal).
        Returns ``"live"``; ``"stale"`` if the row had turned stale or been declared gone
        (the peers must plan with this instance again); ``"removed"`` if the row is gone."""
        t = self.table
        now = self.db.clock.now()
        stamp = update(t).values(heartbeat_at=now, stopping=stopping, **self._published())
        mine = (t.c.tenant == self.db.tenant, t.c.id == instance_id)
        if conn.execute(stamp.where(*mine, t.c.heartbeat_at >= now - stale_timeout)).rowcount:
            return "live"
        return "stale" if conn.execute(stamp.where(*mine)).rowcount else "removed"

    def declare_gone(
        self, conn: Connection, instance_id: str, liveness: str, reason: str, stale_timeout: float
    ) -> bool:
        """Age the heartbeat of a live instance whose row still records ``liveness`` past
        the stale timeout, recording ``reason``; True if it was declared gone here."""
        t = self.table
        now = self.db.clock.now()
        result = conn.execute(
            update(t)
            .where(
                t.c.tenant == self.db.tenant,
                t.c.id == instance_id,
                t.c.liveness == liveness,
                t.c.heartbeat_at >= now - stale_timeout,
            )
            .values(heartbeat_at=now - stale_timeout - 1, liveness=json.dumps({"gone": reason}))
        )
        return result.rowcount == 1

    def update_runs(
        self, conn: Connection, instance_id: str, runs: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """Record what the instance runs now (it stopped applying a consumer)."""
        t = self.table
        conn.execute(
            update(t)
            .where(t.c.tenant == self.db.tenant, t.c.id == instance_id)
            .values(runs=json.dumps(runs, sort_keys=True))
        )

    def publish_in_memory(
        self, conn: Connection, instance_id: str, published: Mapping[str, Any]
    ) -> None:
        """Record what the instance's in-memory consumers are doing (JSON, for reports)."""
        t = self.table
        conn.execute(
            update(t)
            .where(t.c.tenant == self.db.tenant, t.c.id == instance_id)
            .values(in_memory=json.dumps(published, sort_keys=True))
        )

    def in_memory(self, conn: Connection) -> dict[str, dict[str, Any]]:
        """What each instance last published about its in-memory consumers, by instance id:
        ``{"admin": URL or None, "consumers": {name: {"state", "position", ...}}}``."""
        t = self.table
        rows = conn.execute(
            select(t.c.id, t.c.in_memory).where(
                t.c.tenant == self.db.tenant, t.c.in_memory.is_not(None)
            )
        )
        return {r.id: json.loads(r.in_memory) for r in rows}

    def declaring(
        self, conn: Connection, stale_timeout: float, consumer: str
    ) -> tuple[list[InstanceRow], list[InstanceRow]]:
        """The live instances, and those of them whose code declares ``consumer``
        (:meth:`InstanceRow.declares`)."""
        live = [m for m in self.instances(conn, stale_timeout) if m.live]
        published = self.in_memory(conn)
        return live, [m for m in live if m.declares(consumer, stale_of(published, m.id))]

    def deregister(self, conn: Connection, instance_id: str) -> None:
        """Delete this instance's row (clean stop)."""
        t = self.table
        conn.execute(delete(t).where(t.c.tenant == self.db.tenant, t.c.id == instance_id))

    def remove_stale(self, conn: Connection, stale_timeout: float) -> int:
        """Delete this tenant's rows whose heartbeat is older than
        :func:`stale_row_retention`, judged by the database clock; return how many.

        One ``DELETE`` on the (tenant, heartbeat_at) index. Partitions a deleted instance
        still owns are then owned by an id that is not live, which a claim treats like
        any stale owner; an instance that was only paused registers again on its next
        heartbeat, and its fence fails as it would have anyway.
        """
        t = self.table
        result = conn.execute(
            delete(t).where(
                t.c.tenant == self.db.tenant,
                t.c.heartbeat_at < self.db.clock.now() - stale_row_retention(stale_timeout),
            )
        )
        return int(result.rowcount)

    def remove_stale_when_due(self, stale_timeout: float) -> int:
        """:meth:`remove_stale` in its own transaction, at most once every
        :data:`STALE_ROW_PURGE_INTERVAL` seconds per :class:`Membership`; return how many rows
        went. A database error is logged and not raised (the next due round tries again),
        except an unreachable database, which is the caller's outage to log."""
        now = time.monotonic()
        if now < self._next_purge:
            return 0
        self._next_purge = now + STALE_ROW_PURGE_INTERVAL
        try:
            with self.db.transaction() as conn:
                removed = self.remove_stale(conn, stale_timeout)
        except DBAPIError as exc:
            if is_unreachable(exc):
                raise  # the caller's outage: logged once, however many loops see it
            log.warning("removing stale instance rows failed; trying again later: %s", exc.orig)
            return 0
        if removed:
            log.info("removed %d stale instance row(s)", removed)
        return removed

    def live_ids(self, stale_timeout: float) -> Select[tuple[str]]:
        """A subquery of the ids of live instances."""
        t = self.table
        return select(t.c.id).where(
            t.c.tenant == self.db.tenant,
            t.c.heartbeat_at >= self.db.clock.now() - stale_timeout,
        )

    def instances(self, conn: Connection, stale_timeout: float) -> list[InstanceRow]:
        """Every registered instance with its liveness, ordered by name then id."""
        params = {"t": self.db.tenant, "timeout": stale_timeout, **now_params(self.db.clock)}
        rows = _fastpath.fetch(
            conn,
            _instances_query(self.table, self.db.clock),
            params,
            direct=_fastpath.sends_directly(conn),
        )
        runs_of, sessions_of = self._runs, self._sessions
        if len(runs_of) + len(sessions_of) > 4 * len(rows):  # texts no row holds any more
            runs_of.clear()
            sessions_of.clear()
        found = []
        for r in rows:
            runs = runs_of.get(r[8])
            if runs is None:
                runs = runs_of[r[8]] = json.loads(r[8])
            sessions = sessions_of.get(r[10])
            if sessions is None:
                sessions = sessions_of[r[10]] = parse_sessions(r[10])
            found.append(
                InstanceRow(
                    id=r[0],
                    name=r[1],
                    host=r[2],
                    pid=r[3],
                    started_at=float(r[4]),
                    heartbeat_at=float(r[5]),
                    stopping=bool(r[6]),
                    live=bool(r[7]),
                    runs=runs,
                    expires_in=float(r[9]),
                    sessions=sessions,
                    liveness=r[11],
                )
            )
        return found


@per_table
def _instances_query(t: Table, clock: Clock) -> Select[Any]:
    """The query of :meth:`Membership.instances` on the table ``t`` by ``clock``, built once:
    the tenant (``t``), the stale timeout (``timeout``) and a manual clock's now are its
    parameters; its values come as the driver gives them (converted there)."""
    now = cached_now(clock)
    timeout = bindparam("timeout", type_=Float)
    live = case((t.c.heartbeat_at >= now - timeout, True), else_=False)
    return (
        select(
            t.c.id,
            t.c.name,
            t.c.host,
            t.c.pid,
            *(type_coerce(c, NullType()) for c in (t.c.started_at, t.c.heartbeat_at)),
            type_coerce(t.c.stopping, NullType()),
            type_coerce(live, NullType()),
            t.c.runs,
            type_coerce(t.c.heartbeat_at + timeout - now, NullType()),
            t.c.sessions,
            t.c.liveness,
        )
        .where(t.c.tenant == bindparam("t"))
        .order_by(t.c.name, t.c.id)
    )
