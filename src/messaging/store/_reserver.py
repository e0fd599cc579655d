"""The first step of every append: positions reserved on the tenant's counter, and the
last version of each source appended to, read under that counter's row lock."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    bindparam,
    func,
    null,
    select,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.sql import Executable
from sqlalchemy.types import NullType

from messaging._errors import SchemaError
from messaging.store import _fastpath
from messaging.store._clock import cached_now, now_params
from messaging.store._database import Database
from messaging.store._wakeup import APPENDED


class Reserver:
    """Reserves positions for the appends of one database's tenant."""

    def __init__(self, db: Database) -> None:
        self.db = db
        p = db.schema.positions
        self._reserve = (
            update(p)
            .where(p.c.tenant == bindparam("t"))
            .values(last_position=p.c.last_position + bindparam("n", type_=BigInteger()))
        )
        # built once per database: every reserver of it shares them
        self._versions: dict[tuple[int, bool], Executable] = db.statements.setdefault(
            (Reserver, "versions"), {}
        )

    def reserve(
        self, conn: Connection, count: int, keys: Iterable[tuple[str, str]]
    ) -> tuple[int, float, dict[tuple[str, str], int]]:
        """Reserve ``count`` positions on the tenant's counter (its row lock then keeps any
        other append from changing a source's version until we commit); return the first
        position, the database's time and the last version of each ``(topic, source)``.
        The counter's ``UPDATE``, then one query per topic (and chunk of 512 sources, padded
        to a power of two), the first also reading the counter back: two round trips for
        the sends of a batch to one topic."""
        direct, tenant = _fastpath.sends_directly(conn), self.db.tenant
        if _fastpath.execute(conn, self._reserve, [{"t": tenant, "n": count}], direct=direct) != 1:
            raise SchemaError(
                f"no position counter for tenant {tenant!r}; call Database.prepare() first"
            )
        by_topic: dict[str, list[str]] = {}
        for topic, source in keys:
            by_topic.setdefault(topic, []).append(source)
        # Database.transaction wakes this host's readers of these topics after the commit
        conn.info.setdefault(APPENDED, set()).update(by_topic)
        found: dict[tuple[str, str], int] = {}
        last, now = None, 0.0
        for topic, unsorted in by_topic.items():
            sources = sorted(unsorted)
            for start in range(0, len(sources), 512):
                chunk = _fastpath.padded(sources[start : start + 512])
                params: dict[str, Any] = dict(
                    zip(_fastpath.numbered(("s",), len(chunk)), chunk, strict=True)
                )
                params.update(t=tenant, topic=topic)
                if last is None:
                    params.update(now_params(self.db.clock))
                query = self._versions_query(len(chunk), counter=last is None)
                for source, version, clock in _fastpath.fetch(conn, query, params, direct=direct):
                    if source is None:  # the counter's row
                        last, now = version, float(clock)
                    else:
                        found[(topic, source)] = version
        if last is None:
            raise SchemaError(f"the position counter of tenant {tenant!r} vanished")
        return last - count + 1, now, found

    def _versions_query(self, size: int, *, counter: bool) -> Executable:
        """The last versions of ``size`` sources of one topic (``t``, ``topic``, ``s<i>``),
        after the counter's row (source NULL: last position, the database's time)."""
        query = self._versions.get((size, counter))
        if query is None:
            m, p = self.db.schema.messages, self.db.schema.positions
            query = (
                select(m.c.source, func.max(m.c.version), null())
                .where(m.c.tenant == bindparam("t"), m.c.topic == bindparam("topic"))
                .where(m.c.source.in_([bindparam(f"s{i}") for i in range(size)]))
                .group_by(m.c.source)
            )
            if counter:  # the clock as the driver gives it: converted by float() above
                clock = type_coerce(cached_now(self.db.clock), NullType())
                read_back = select(null(), p.c.last_position, clock)
                query = union_all(read_back.where(p.c.tenant == bindparam("t")), query)
            self._versions[(size, counter)] = query
        return query
