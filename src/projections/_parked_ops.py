"""Operator commands on parked sources (``on-failure: park-source``): list, retry, skip, evict.

Each command runs like the others in :mod:`projections._operations`: one transaction
that locks the consumer's row, checks the request (a clear error changes nothing),
audits who and why under a command id (a retry of an unacknowledged commit is not
applied twice), and fences the partitions it touches (a new epoch, no owner): their
owner's next commit fails, and whoever claims them next reads the parked set as the
command left it (:mod:`messaging.failures._parking`). The retry itself is applied by
that owner, in one fenced transaction per source.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, update

from messaging import Database, OperationError
from messaging.operations import (
    PARKED,
    RETRYING,
    RETRYING_SKIPPED,
    bump_generation,
    unknown_consumer,
)
from projections._operations import _audit, _once, _state, check_reason


def _topics_and_types(db: Database, conn: Connection, consumer: str) -> tuple[list[str], list[str]]:
    t = db.schema.consumers
    row = conn.execute(
        select(t.c.topics, t.c.types).where(t.c.tenant == db.tenant, t.c.name == consumer)
    ).one()
    return list(json.loads(row.topics)), list(json.loads(row.types))


def _known(db: Database, conn: Connection, consumer: str) -> None:
    t = db.schema.consumers
    names = list(
        conn.execute(select(t.c.name).where(t.c.tenant == db.tenant).order_by(t.c.name)).scalars()
    )
    if consumer not in names:
        raise OperationError(unknown_consumer(consumer, names))


def _held(
    db: Database, conn: Connection, consumer: str, source: str, first: int, partition: int
) -> list[tuple[int, str]]:
    """(position, type) of ``source``'s held messages: from ``first`` to its partition's
    checkpoint, of the consumer's topics and types, without those skipped."""
    m, p, s = db.schema.messages, db.schema.partitions, db.schema.skipped
    topics, types = _topics_and_types(db, conn, consumer)
    checkpoint = conn.execute(
        select(p.c.checkpoint).where(
            p.c.tenant == db.tenant, p.c.consumer == consumer, p.c.partition_no == partition
        )
    ).scalar_one()
    skipped = select(s.c.position).where(
        s.c.tenant == db.tenant, s.c.consumer == consumer, s.c.source == source
    )
    rows = conn.execute(
        select(m.c.position, m.c.type)
        .where(
            m.c.tenant == db.tenant,
            m.c.topic.in_(topics),
            m.c.source == source,
            m.c.position >= first,
            m.c.position <= checkpoint,
            m.c.type.in_(types),
            m.c.position.not_in(skipped),
        )
        .order_by(m.c.position)
    )
    return [(r.position, r.type) for r in rows]


def parked(db: Database, consumer: str, *, skipped: bool = False) -> dict[str, Any]:
    """The parked sources of ``consumer`` (source, partition, first position, how many
    messages are held, error, trace, when, state), and with ``skipped`` the messages
    skipped (by ``resume --skip-poison``, ``skip`` or ``evict``)."""
    t, s = db.schema.parked, db.schema.skipped
    with db.read() as conn:
        _known(db, conn, consumer)
        rows = conn.execute(
            select(t)
            .where(t.c.tenant == db.tenant, t.c.consumer == consumer)
            .order_by(t.c.partition_no, t.c.position)
        ).all()
        sources = [
            {
                "source": r.source,
                "partition": r.partition_no,
                "position": r.position,
                "count": len(_held(db, conn, consumer, r.source, r.position, r.partition_no)),
                "type": r.type,
                "error": r.error,
                "trace": r.trace,
                "parked_at": r.parked_at,
                "state": r.state,
            }
            for r in rows
        ]
        report: dict[str, Any] = {"consumer": consumer, "parked": sources}
        if skipped:
            report["skipped"] = [
                {
                    "position": r.position,
                    "source": r.source,
                    "partition": r.partition_no,
                    "type": r.type,
                    "error": r.error,
                    "skipped_at": r.skipped_at,
                    "who": r.who,
                }
                for r in conn.execute(
                    select(s)
                    .where(s.c.tenant == db.tenant, s.c.consumer == consumer)
                    .order_by(s.c.position)
                )
            ]
    return report


def _parked_rows(db: Database, conn: Connection, consumer: str, source: str | None) -> list[Any]:
    """The parked rows the command acts on (locked), or a clear error naming why none."""
    t = db.schema.parked
    query = select(t).where(t.c.tenant == db.tenant, t.c.consumer == consumer)
    if source is not None:
        query = query.where(t.c.source == source)
    rows = conn.execute(query.order_by(t.c.position).with_for_update()).all()
    if source is None:
        waiting = [r for r in rows if r.state == PARKED]
        if not waiting:
            retrying = " (its parked sources are being retried already)" if rows else ""
            raise OperationError(f"consumer {consumer!r} has no parked source{retrying}")
        return waiting
    if not rows:
        raise OperationError(_not_parked(db, conn, consumer, source))
    if rows[0].state == RETRYING:
        raise OperationError(
            f"source {source!r} of consumer {consumer!r} is being retried already "
            "(by another command): wait until it is applied or parked again"
        )
    return list(rows)


def _not_parked(db: Database, conn: Connection, consumer: str, source: str) -> str:
    m, p = db.schema.messages, db.schema.partitions
    topics, _ = _topics_and_types(db, conn, consumer)
    known = conn.execute(
        select(func.count())
        .select_from(m)
        .where(m.c.tenant == db.tenant, m.c.topic.in_(topics), m.c.source == source)
    ).scalar_one()
    if not known:
        return f"no source {source!r} in the topics of consumer {consumer!r} ({', '.join(topics)})"
    halted = conn.execute(
        select(func.count())
        .select_from(p)
        .where(p.c.tenant == db.tenant, p.c.consumer == consumer, p.c.status == "halted")
    ).scalar_one()
    hint = (
        "; it halts its partition on a failure instead (on-failure: halt-partition): "
        "see `projections resume --skip-poison`"
        if halted
        else ""
    )
    return f"source {source!r} of consumer {consumer!r} is not parked{hint}"


def _fence(db: Database, conn: Connection, consumer: str, partitions: Iterable[int]) -> None:
    """Release ``partitions`` under a new epoch: their owner claims them again and reads
    the parked set as this command left it."""
    t = db.schema.partitions
    conn.execute(
        update(t)
        .where(
            t.c.tenant == db.tenant,
            t.c.consumer == consumer,
            t.c.partition_no.in_(sorted(set(partitions))),
        )
        .values(owner=None, epoch=t.c.epoch + 1, updated_at=db.clock.now())
    )
    bump_generation(db, conn)


def _record_skipped(
    db: Database,
    conn: Connection,
    consumer: str,
    row: Any,
    held: Sequence[tuple[int, str]],
    who: str,
) -> None:
    for position, type_name in held:
        conn.execute(
            insert(db.schema.skipped).values(
                tenant=db.tenant,
                consumer=consumer,
                position=position,
                source=row.source,
                partition_no=row.partition_no,
                type=type_name,
                error=row.error if position == row.position else None,
                skipped_at=db.clock.now(),
                who=who,
            )
        )


def retry(
    db: Database, consumer: str, *, source: str | None = None, who: str, reason: str = ""
) -> list[str]:
    """Have the owner of each parked source of ``consumer`` (or of ``source`` only) apply
    its held messages, in their order, before any newer one; return the sources."""
    check_reason(reason)

    def body(conn: Connection, command_id: str) -> list[str]:
        _state(db, conn, consumer)
        rows = _parked_rows(db, conn, consumer, source)
        t = db.schema.parked
        sources = [r.source for r in rows]
        conn.execute(
            update(t)
            .where(t.c.tenant == db.tenant, t.c.consumer == consumer, t.c.source.in_(sources))
            .values(state=RETRYING)
        )
        _fence(db, conn, consumer, [r.partition_no for r in rows])
        detail = {"reason": reason, "sources": sources}
        _audit(db, conn, "retry", consumer, who, detail, command_id)
        return sources

    return _once(db, "retry", body, lambda detail: list(detail["sources"]))


def retry_skipped(
    db: Database, consumer: str, *, source: str | None, who: str, reason: str = ""
) -> int:
    """Have the owner of ``source`` apply its skipped messages (by ``skip``, ``evict`` or
    ``resume --skip-poison``), in their order, once; return how many."""
    check_reason(reason)
    if source is None:
        raise OperationError("retry --skipped needs the source: give --source")

    def body(conn: Connection, command_id: str) -> int:
        _state(db, conn, consumer)
        t, s = db.schema.parked, db.schema.skipped
        if conn.execute(
            select(t.c.state).where(
                t.c.tenant == db.tenant, t.c.consumer == consumer, t.c.source == source
            )
        ).first():
            raise OperationError(
                f"source {source!r} of consumer {consumer!r} is parked or being retried: "
                "retry it first, then its skipped messages"
            )
        rows = conn.execute(
            select(s)
            .where(s.c.tenant == db.tenant, s.c.consumer == consumer, s.c.source == source)
            .order_by(s.c.position)
        ).all()
        if not rows:
            raise OperationError(
                f"source {source!r} of consumer {consumer!r} has no skipped message"
            )
        first = rows[0]
        conn.execute(
            insert(t).values(
                tenant=db.tenant,
                consumer=consumer,
                source=source,
                partition_no=first.partition_no,
                position=first.position,
                type=first.type,
                error=first.error,
                parked_at=db.clock.now(),
                state=RETRYING_SKIPPED,
            )
        )
        _fence(db, conn, consumer, [first.partition_no])
        positions = [r.position for r in rows]
        detail = {"reason": reason, "source": source, "positions": positions}
        _audit(db, conn, "retry --skipped", consumer, who, detail, command_id)
        return len(rows)

    return _once(db, "retry", body, lambda detail: len(detail["positions"]))


def skip(db: Database, consumer: str, *, source: str, who: str, reason: str = "") -> dict[str, Any]:
    """Skip the head message of parked ``source`` (recorded, never applied) and retry the
    rest of its held messages; return the skipped message."""
    check_reason(reason)

    def body(conn: Connection, command_id: str) -> dict[str, Any]:
        _state(db, conn, consumer)
        [row] = _parked_rows(db, conn, consumer, source)
        held = _held(db, conn, consumer, source, row.position, row.partition_no)
        _record_skipped(db, conn, consumer, row, held[:1], who)
        t = db.schema.parked
        mine = (t.c.tenant == db.tenant, t.c.consumer == consumer, t.c.source == source)
        if len(held) > 1:  # the rest is retried from the next held message
            conn.execute(update(t).where(*mine).values(state=RETRYING, position=held[1][0]))
        else:
            conn.execute(delete(t).where(*mine))
        _fence(db, conn, consumer, [row.partition_no])
        skipped = {"source": source, "position": row.position, "type": row.type}
        detail = {"reason": reason, "skipped": skipped, "retried": len(held) - 1}
        _audit(db, conn, "skip", consumer, who, detail, command_id)
        return skipped

    return _once(db, "skip", body, lambda detail: dict(detail["skipped"]))


def evict(db: Database, consumer: str, *, source: str, who: str, reason: str = "") -> int:
    """Drop parked ``source``'s held messages (each recorded as skipped; its newer
    messages are applied again); return how many."""
    check_reason(reason)

    def body(conn: Connection, command_id: str) -> int:
        _state(db, conn, consumer)
        [row] = _parked_rows(db, conn, consumer, source)
        held = _held(db, conn, consumer, source, row.position, row.partition_no)
        _record_skipped(db, conn, consumer, row, held, who)
        t = db.schema.parked
        conn.execute(
            delete(t).where(t.c.tenant == db.tenant, t.c.consumer == consumer, t.c.source == source)
        )
        _fence(db, conn, consumer, [row.partition_no])
        detail = {"reason": reason, "source": source, "from": row.position, "evicted": len(held)}
        _audit(db, conn, "evict", consumer, who, detail, command_id)
        return len(held)

    return _once(db, "evict", body, lambda detail: int(detail["evicted"]))


def command(
    db: Database,
    command: str,
    consumer: str,
    source: str | None,
    who: str,
    reason: str,
    *,
    skipped: bool = False,
) -> dict[str, Any]:
    """Run ``retry`` (of the skipped messages with ``skipped``), ``skip`` or ``evict``
    (the admin's commands); its outcome as JSON."""
    if command == "retry" and skipped:
        count = retry_skipped(db, consumer, source=source, who=who, reason=reason)
        return {"retrying_skipped": count}
    if command == "retry":
        return {"retrying": retry(db, consumer, source=source, who=who, reason=reason)}
    if source is None:
        raise OperationError(f"{command} needs the parked source: give 'source'")
    if command == "skip":
        return {"skipped": skip(db, consumer, source=source, who=who, reason=reason)}
    return {"evicted": evict(db, consumer, source=source, who=who, reason=reason)}
