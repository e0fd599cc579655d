"""Operator commands: pause, resume (optionally past a poison message) and rebuild a
consumer, from any instance or the CLI. The state lives in the database, so every
instance follows within one poll: each command bumps the epochs of the partitions it
touches, which makes the current owners' next commit fail and roll back. Each command
is recorded in the audit table with who, when and why: ``who`` is the identity the caller
established (the CLI's ``user@host``, the admin server's ``admin token@<peer address>``),
never one a client claims; ``reason`` is at most :data:`MAX_REASON_LENGTH` characters.

A command applied twice is harmless: each call carries a command id, recorded with its
audit entry in the same transaction. When the acknowledgement of its commit is lost
(:func:`~messaging.store._retry.is_ambiguous`), the retry first looks the id up: if the entry
is there, the command took effect and is not applied again (a ``resume --skip-poison``
skips one message, never two; a rebuild resets once), and its recorded result is returned.
"""

from __future__ import annotations

import getpass
import json
import socket
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, delete, insert, select, update

from messaging import ConflictRetrySettings, ConsumerSettings, Database, OperationError
from messaging.operations import (
    NOT_HALTED,
    ROUTE_CONSUMER,
    ConsumerState,
    Membership,
    Ownership,
    PartitionStatus,
    bump_generation,
    for_command,
    lifecycle_event,
    retry_command,
    split_unit,
    unit_rows,
    unknown_consumer,
)
from projections._kinds import PROJECTION

T = TypeVar("T")
DEFAULT_STALE_TIMEOUT = ConsumerSettings().stale_instance_timeout
"""Tells live instances when a command is given no ``stale_timeout`` (the default
``stale-instance-timeout``)."""
#: Most characters of a command's recorded reason.
MAX_REASON_LENGTH = 200


def default_operator() -> str:
    """``user@host`` of whoever runs the command."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[:200]  # the audit's who column holds 200


def check_reason(reason: str) -> None:
    """Raise :class:`OperationError` when ``reason`` is longer than MAX_REASON_LENGTH."""
    if len(reason) > MAX_REASON_LENGTH:
        raise OperationError(
            f"the reason has {len(reason)} characters; at most {MAX_REASON_LENGTH} are recorded"
        )


def _state(db: Database, conn: Connection, consumer: str) -> str:
    table = db.schema.consumers
    state = conn.execute(
        select(table.c.state)
        .where(table.c.tenant == db.tenant, table.c.name == consumer)
        .with_for_update()
    ).scalar_one_or_none()
    if state is None:
        known = conn.execute(select(table.c.name).where(table.c.tenant == db.tenant)).scalars()
        raise OperationError(unknown_consumer(consumer, known))
    return str(state)


def _declared(db: Database, conn: Connection, consumer: str, stale_timeout: float) -> None:
    """Refuse a command on ``consumer`` when instances are live and none declares it: the
    running code no longer has it, so nothing would carry the command out. With no live
    instance at all it is accepted (the instances started next carry it out)."""
    live, declaring = Membership(db).declaring(conn, stale_timeout, consumer)
    if live and not declaring:
        raise OperationError(
            f"consumer {consumer!r} is declared by none of the {len(live)} live instance(s): "
            f"deploy code that declares it first, or remove it (`projections remove "
            f"{consumer}`)"
        )


def _kind(db: Database, conn: Connection, consumer: str) -> str:
    table = db.schema.consumers
    return str(
        conn.execute(
            select(table.c.kind).where(table.c.tenant == db.tenant, table.c.name == consumer)
        ).scalar_one()
    )


def _set_state(db: Database, conn: Connection, consumer: str, state: str) -> None:
    table = db.schema.consumers
    conn.execute(
        update(table)
        .where(table.c.tenant == db.tenant, table.c.name == consumer)
        .values(state=state, updated_at=db.clock.now())
    )


def _fence_all(db: Database, conn: Connection, consumer: str) -> None:
    """Release every partition under a new epoch: current owners can commit nothing more;
    every instance plans again at its next pulse."""
    Ownership(db).fence_all(conn, consumer)
    bump_generation(db, conn)


class _Recorded(Exception):
    """The command's audit entry was found: it committed (unacknowledged) before."""

    def __init__(self, detail: dict[str, Any]) -> None:
        super().__init__("already applied")
        self.detail = detail


def _once(
    db: Database,
    command: str,
    body: Callable[[Connection, str], T],
    recorded: Callable[[dict[str, Any]], T],
) -> T:
    """Run ``body(conn, command_id)`` (which audits with that id) in a transaction, retried
    on transient errors as a one-shot command's (:func:`~messaging.store._retry.retry_command`);
    after one of unknown outcome, first look for the audit entry: found, the command is not
    applied again and ``recorded(its detail)`` is returned."""
    command_id = uuid.uuid4().hex

    def attempt() -> T:
        with db.transaction() as conn:
            return body(conn, command_id)

    def reread(_error: BaseException) -> None:
        detail = recorded_detail(db, command_id)
        if detail is not None:
            raise _Recorded(detail)

    try:
        return retry_command(
            attempt, db, for_command(ConflictRetrySettings()), what=command, reread=reread
        )
    except _Recorded as found:
        return recorded(found.detail)


def recorded_detail(db: Database, command_id: str) -> dict[str, Any] | None:
    """The detail of the audit entry of command ``command_id``, or None when there is none
    (an equality lookup on the indexed ``command_id`` column)."""
    a = db.schema.audit
    with db.read() as conn:
        detail = conn.execute(
            select(a.c.detail).where(a.c.tenant == db.tenant, a.c.command_id == command_id)
        ).scalar_one_or_none()
    return None if detail is None else dict(json.loads(detail))


def _audit(
    db: Database,
    conn: Connection,
    command: str,
    consumer: str,
    who: str,
    detail: dict[str, Any],
    command_id: str,
) -> None:
    lifecycle_event(command.replace(" --", "-"), consumer=consumer, who=who, **detail)
    conn.execute(
        insert(db.schema.audit).values(
            tenant=db.tenant,
            at=db.clock.now(),
            who=who,
            command=command,
            consumer=consumer,
            detail=json.dumps(detail, sort_keys=True),
            command_id=command_id,
        )
    )


def pause(
    db: Database,
    consumer: str,
    *,
    who: str,
    reason: str = "",
    stale_timeout: float = DEFAULT_STALE_TIMEOUT,
) -> None:
    """Stop every instance from applying ``consumer`` until it is resumed (refused when
    live instances run code that does not declare it, as by :func:`resume` and
    :func:`rebuild`; ``stale_timeout`` tells live instances)."""
    check_reason(reason)

    def body(conn: Connection, command_id: str) -> None:
        state = _state(db, conn, consumer)
        _declared(db, conn, consumer, stale_timeout)
        if state == ConsumerState.PAUSED:
            raise OperationError(f"consumer {consumer!r} is already paused")
        if state != ConsumerState.RUNNING:
            raise OperationError(f"consumer {consumer!r} is {state}; it can be paused when running")
        _set_state(db, conn, consumer, ConsumerState.PAUSED)
        _fence_all(db, conn, consumer)
        _audit(db, conn, "pause", consumer, who, {"reason": reason}, command_id)

    _once(db, "pause", body, lambda _detail: None)


def resume(
    db: Database,
    consumer: str,
    *,
    who: str,
    reason: str = "",
    skip_poison: bool = False,
    stale_timeout: float = DEFAULT_STALE_TIMEOUT,
) -> list[dict[str, Any]]:
    """Let ``consumer`` run again: a paused consumer continues, halted partitions retry their
    poison message, or, with ``skip_poison``, continue right after it (it is recorded, never
    applied). Returns the halted messages it resumed at or skipped."""
    t = db.schema.partitions
    check_reason(reason)

    def body(conn: Connection, command_id: str) -> list[dict[str, Any]]:
        state = _state(db, conn, consumer)
        _declared(db, conn, consumer, stale_timeout)
        if state not in (ConsumerState.RUNNING, ConsumerState.PAUSED):
            raise OperationError(f"consumer {consumer!r} is {state}; wait until it has finished")
        halted = [
            {
                "partition": r.partition_no,
                "position": r.halted_position,
                "type": r.halted_type,
                "error": r.error,
            }
            for r in conn.execute(
                select(t.c.partition_no, t.c.halted_position, t.c.halted_type, t.c.error)
                .where(
                    t.c.tenant == db.tenant,
                    t.c.consumer == consumer,
                    t.c.status == PartitionStatus.HALTED,
                )
                .order_by(t.c.partition_no)
            )
        ]
        if skip_poison and not halted:
            raise OperationError(f"consumer {consumer!r} has no halted partition to skip past")
        if state == ConsumerState.RUNNING and not halted:
            raise OperationError(f"consumer {consumer!r} is running and has no halted partition")
        for entry in halted:
            where = (t.c.tenant == db.tenant, t.c.consumer == consumer)
            skipped = {"checkpoint": entry["position"]} if skip_poison else {}
            if skip_poison:
                _record_skip(db, conn, consumer, entry, who)
            conn.execute(
                update(t)
                .where(*where, t.c.partition_no == entry["partition"])
                .values(
                    status=PartitionStatus.RUNNING,
                    **NOT_HALTED,
                    **skipped,
                )
            )
        _set_state(db, conn, consumer, ConsumerState.RUNNING)
        _fence_all(db, conn, consumer)
        command = "resume --skip-poison" if skip_poison else "resume"
        _audit(db, conn, command, consumer, who, {"reason": reason, "halted": halted}, command_id)
        return halted

    return _once(db, "resume", body, lambda detail: list(detail["halted"]))


def _record_skip(
    db: Database, conn: Connection, consumer: str, halted: dict[str, Any], who: str
) -> None:
    """List a message skipped past with the parked ones (``projections parked --skipped``)."""
    m = db.schema.messages
    source = conn.execute(
        select(m.c.source).where(m.c.tenant == db.tenant, m.c.position == halted["position"])
    ).scalar_one_or_none()
    if source is None:  # not a stored message (a saga's deadline): nothing to list
        return
    conn.execute(
        insert(db.schema.skipped).values(
            tenant=db.tenant,
            consumer=consumer,
            position=halted["position"],
            source=source,
            partition_no=halted["partition"],
            type=halted["type"],
            error=halted["error"],
            skipped_at=db.clock.now(),
            who=who,
        )
    )


def rebuild(
    db: Database,
    consumer: str,
    *,
    who: str,
    reason: str = "",
    stale_timeout: float = DEFAULT_STALE_TIMEOUT,
) -> None:
    """Build a new version of projection ``consumer`` beside the live one, which goes on
    being applied and read until the new one takes over. The first instance running it
    starts the version (it has the table declarations)."""
    check_reason(reason)
    name, version = split_unit(consumer)
    if version is not None:
        raise OperationError(f"{consumer!r} is version {version} of {name!r}: rebuild {name!r}")

    def body(conn: Connection, command_id: str) -> None:
        state = _state(db, conn, consumer)
        kind = _kind(db, conn, consumer)
        if kind != PROJECTION.value:
            raise OperationError(
                f"consumer {consumer!r} is a {kind}: only projections can be rebuilt "
                "(replaying a route consumer or saga would repeat its effects)"
            )
        _declared(db, conn, consumer, stale_timeout)
        if state in (ConsumerState.REBUILD_REQUESTED, ConsumerState.REBUILDING):
            raise OperationError(f"consumer {consumer!r} is already being rebuilt")
        building = [u.unit for u in unit_rows(db, conn, [consumer]) if u.building]
        if building or state == ConsumerState.CUTTING_OVER:
            raise OperationError(
                f"consumer {consumer!r} is already being rebuilt: "
                f"{', '.join(building) or 'its new version is taking over'}"
            )
        _set_state(db, conn, consumer, ConsumerState.REBUILD_REQUESTED)
        _audit(db, conn, "rebuild", consumer, who, {"reason": reason, "was": state}, command_id)
        bump_generation(db, conn)  # the instances running it start the version at once

    _once(db, "rebuild", body, lambda _detail: None)


def forget_processed(
    db: Database, consumer: str, *, older_than: float, who: str, reason: str = ""
) -> int:
    """Forget the message ids an idempotent route consumer handled more than
    ``older_than`` seconds ago (its guard's table only grows); return how many. A message
    with a forgotten id that is sent again is handled again."""
    check_reason(reason)
    if older_than < 0:
        raise OperationError(f"--older-than must not be negative, got {older_than}")
    t = db.schema.processed

    def body(conn: Connection, command_id: str) -> int:
        _state(db, conn, consumer)
        kind = _kind(db, conn, consumer)
        if kind != ROUTE_CONSUMER.value:
            raise OperationError(
                f"consumer {consumer!r} is a {kind}: only route consumers record handled ids"
            )
        forgotten = conn.execute(
            delete(t).where(
                t.c.tenant == db.tenant,
                t.c.consumer == consumer,
                t.c.processed_at < db.clock.now() - older_than,
            )
        ).rowcount
        detail = {"reason": reason, "older_than": older_than, "forgotten": forgotten}
        _audit(db, conn, "forget-processed", consumer, who, detail, command_id)
        return int(forgotten)

    return _once(db, "forget-processed", body, lambda detail: int(detail["forgotten"]))


def audit_log(db: Database, consumer: str | None = None) -> list[dict[str, Any]]:
    """Recorded operator commands, oldest first, each with its ``command_id`` (entries
    written before schema V9 keep it inside their detail: it is taken from there)."""
    a = db.schema.audit
    query = select(a.c.at, a.c.who, a.c.command, a.c.consumer, a.c.detail, a.c.command_id).where(
        a.c.tenant == db.tenant
    )
    if consumer is not None:
        query = query.where(a.c.consumer == consumer)
    entries = []
    with db.read() as conn:
        for r in conn.execute(query.order_by(a.c.id)):
            detail = json.loads(r.detail or "{}")
            entries.append(
                {
                    "at": r.at,
                    "who": r.who,
                    "command": r.command,
                    "consumer": r.consumer,
                    "detail": detail,
                    "command_id": r.command_id or detail.pop("command_id", None),
                }
            )
    return entries
