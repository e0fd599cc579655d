"""Whether consumers have applied a consistency token, read from the database alone.

A consumer has applied a token when, for each mark ``(topic, hash, position)`` of a topic
it reads, the partition ``hash % partitions`` (every partition for a mark without hash)
has no message of its topics and types after its committed checkpoint up to the
position, and holds none of them back (a parked source's, one an operator skipped:
:mod:`messaging.waits._held`). A checkpoint at or past the position answers without a
query of the messages; a partition without a checkpoint row counts from 0 (it has
applied nothing); a message type the consumer does not handle is answered once nothing
it handles is left before it.

Every position of the token must hold the token's message, committed: a position past the
tenant's committed head is still being written (not applied yet); a position at or below
it that holds no message of the token's topic and hash was rolled back (its append never
committed), and waiting on it is refused. The head is read before the messages: under
READ COMMITTED every statement reads what was committed when it started, so a position
at or below the head is committed when the messages are read.

The answer is the live version's (the ``consumers`` row of the name): while a projection is
rebuilt, its live version keeps applying; after a cutover, the new live version's
checkpoints answer (it applied past the old one's before taking over).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs
from sqlalchemy import Connection, func, select
from sqlalchemy.sql.elements import ColumnElement

from messaging._errors import UnknownConsumer, WaitRefused, unknown_consumer
from messaging._states import ConsumerState, PartitionStatus
from messaging.distribution._membership import Membership
from messaging.distribution._ownership import Ownership, PartitionRow
from messaging.store._database import Database
from messaging.store._tokens import ConsistencyToken, InvalidToken
from messaging.waits._held import held as held_back

UNCOMMITTED = "not committed yet"
"""The state of a mark whose append has not committed yet."""


@attrs.frozen
class Behind:
    """A partition of a consumer that has not applied the token yet."""

    consumer: str
    partition: int | None
    """None: the token's append itself has not committed yet."""
    position: int
    """The token's position it must pass."""
    checkpoint: int
    lag: int | None
    """Messages it has left to apply up to :attr:`position` (None: not counted)."""
    owner: str | None
    """The name of the instance that owns it (None: nobody)."""
    state: str
    """``running``, ``orphaned`` (its owner stopped beating), ``unowned``, the
    consumer's state while a new version takes over, :data:`UNCOMMITTED`, or the source
    it holds back (``source 'S' retrying from position N``)."""

    def __str__(self) -> str:
        if self.partition is None:
            return f"position {self.position} is {UNCOMMITTED}"
        lag = "" if self.lag is None else f", {self.lag} message(s) to apply"
        owner = f"owner {self.owner}" if self.owner else "no owner"
        return (
            f"{self.consumer} partition {self.partition} at checkpoint {self.checkpoint} "
            f"behind position {self.position}{lag}, {owner} ({self.state})"
        )

    def as_dict(self) -> dict[str, object]:
        return attrs.asdict(self)


@attrs.frozen
class Progress:
    """What is still behind a token (nothing: applied)."""

    behind: tuple[Behind, ...]

    @property
    def applied(self) -> bool:
        return not self.behind


@attrs.frozen
class _Consumer:
    name: str
    state: str
    partitions: int
    topics: tuple[str, ...]
    types: tuple[str, ...]


def progress(
    db: Database,
    conn: Connection,
    token: ConsistencyToken,
    consumers: Sequence[str],
    *,
    detail: bool = False,
    stale_timeout: float = 10.0,
) -> Progress:
    """What of ``consumers`` has not applied ``token`` yet, read in ``conn``'s transaction;
    with ``detail``, each partition's lag and owner too. Raises :class:`UnknownConsumer`,
    or :class:`WaitRefused` when nothing but an operator (or another write) can make it
    applied: a halted partition or a paused consumer behind it, a rolled-back position."""
    if token.tenant != db.tenant:
        raise InvalidToken(
            f"it was issued for tenant {token.tenant!r}, this database serves {db.tenant!r}"
        )
    rows = _consumers(db, conn, consumers)
    uncommitted = _check_marks(db, conn, token)
    behind = [Behind("", None, p, 0, None, None, UNCOMMITTED) for p in uncommitted]
    committed = [m for m in token.marks if m[2] not in uncommitted]
    parts = {(r.consumer, r.partition): r for r in Ownership(db).partitions(conn, consumers)}
    held = held_back(db, conn, consumers, [m[2] for m in committed])
    names: dict[str, tuple[str, bool]] | None = None
    for consumer in rows:
        bounds: dict[int, int] = {}
        marks = [m for m in committed if m[0] in consumer.topics]
        for _topic, h, position in marks:
            for p in range(consumer.partitions) if h is None else [h % consumer.partitions]:
                bounds[p] = max(position, bounds.get(p, 0))
        holding = held.partitions(consumer.name, consumer.partitions, marks)
        for p, bound in sorted(bounds.items()):
            row = parts.get((consumer.name, p))
            checkpoint = 0 if row is None else int(row.checkpoint)
            if p not in holding and (
                checkpoint >= bound or not _pending(db, conn, consumer, p, checkpoint, bound)
            ):
                continue
            _refuse_stopped(consumer, row, p)
            if names is None:
                names = _owner_names(db, conn, stale_timeout)
            owner, state = _owner(consumer, row, names)
            behind.append(
                Behind(
                    consumer.name,
                    p,
                    bound,
                    checkpoint,
                    _lag(db, conn, consumer, p, checkpoint, bound) if detail else None,
                    owner,
                    holding.get(p, state),
                )
            )
    return Progress(tuple(behind))


def _consumers(db: Database, conn: Connection, names: Sequence[str]) -> list[_Consumer]:
    t = db.schema.consumers
    found = {
        r.name: _Consumer(
            r.name, r.state, int(r.partitions), tuple(json.loads(r.topics)), json.loads(r.types)
        )
        for r in conn.execute(
            select(t.c.name, t.c.state, t.c.partitions, t.c.topics, t.c.types).where(
                t.c.tenant == db.tenant, t.c.name.in_(names)
            )
        )
    }
    for name in names:
        if name not in found:
            known = conn.execute(select(t.c.name).where(t.c.tenant == db.tenant)).scalars()
            raise UnknownConsumer(
                f"{unknown_consumer(name, known)} (in this database and tenant; an "
                "in-memory projection's copies live in each instance, not here)"
            )
    return [found[name] for name in names]


def check_consumers(db: Database, names: Sequence[str]) -> None:
    """:class:`UnknownConsumer` (naming the closest) unless each of ``names`` is a consumer
    of this database and tenant: a command checks before it stores anything."""
    with db.read() as conn:
        _consumers(db, conn, names)


def _check_marks(db: Database, conn: Connection, token: ConsistencyToken) -> set[int]:
    """The token's positions not committed yet; :class:`WaitRefused` for one rolled back."""
    if not token.marks:
        return set()
    p, m = db.schema.positions, db.schema.messages
    head = conn.execute(
        select(p.c.last_position).where(p.c.tenant == db.tenant)
    ).scalar_one_or_none()
    head = int(head or 0)
    marked = token.positions
    stored = {
        int(r[0]): (r[1], int(r[2]))
        for r in conn.execute(
            select(m.c.position, m.c.topic, m.c.partition_hash).where(
                m.c.tenant == db.tenant, m.c.position.in_([q for q in marked if q <= head])
            )
        )
    }
    for position, (topic, h) in sorted(marked.items()):
        if position > head:
            continue
        found = stored.get(position)
        if found is None or found[0] != topic or (h is not None and found[1] != h):
            raise WaitRefused(
                f"position {position} holds no message of topic {topic!r} that the token "
                "names: its append rolled back (or the token was altered)"
            )
    return {q for q in marked if q > head}


def _range(
    db: Database, consumer: _Consumer, p: int, after: int, upto: int
) -> list[ColumnElement[bool]]:
    m = db.schema.messages
    return [
        m.c.tenant == db.tenant,
        m.c.topic.in_(consumer.topics),
        m.c.type.in_(consumer.types),
        m.c.position > after,
        m.c.position <= upto,
        m.c.partition_hash % consumer.partitions == p,
    ]


def _pending(
    db: Database, conn: Connection, consumer: _Consumer, p: int, after: int, upto: int
) -> bool:
    """Whether partition ``p`` of ``consumer`` has a message to apply in (after, upto]."""
    m = db.schema.messages
    query = select(m.c.position).where(*_range(db, consumer, p, after, upto)).limit(1)
    return conn.execute(query).first() is not None


def _lag(db: Database, conn: Connection, consumer: _Consumer, p: int, after: int, upto: int) -> int:
    query = select(func.count()).where(*_range(db, consumer, p, after, upto))
    return int(conn.execute(query.select_from(db.schema.messages)).scalar_one())


def _refuse_stopped(consumer: _Consumer, row: PartitionRow | None, p: int) -> None:
    if row is not None and row.status == PartitionStatus.HALTED:
        raise WaitRefused(
            f"{consumer.name} partition {p} is halted at position {row.halted_position} "
            f"({row.halted_type}): {((row.error or '').splitlines() or [''])[0]}; "
            "it applies nothing until an operator resumes it"
        )
    if consumer.state == ConsumerState.PAUSED:
        raise WaitRefused(
            f"{consumer.name} is paused: partition {p} applies nothing until it is resumed"
        )


def _owner_names(
    db: Database, conn: Connection, stale_timeout: float
) -> dict[str, tuple[str, bool]]:
    """Instance id → (name, live)."""
    return {r.id: (r.name, r.live) for r in Membership(db).instances(conn, stale_timeout)}


def _owner(
    consumer: _Consumer, row: PartitionRow | None, names: dict[str, tuple[str, bool]]
) -> tuple[str | None, str]:
    owner = None if row is None else row.owner
    if owner is None:
        return None, "unowned"
    name, live = names.get(owner, (owner, False))
    if consumer.state != ConsumerState.RUNNING:
        return name, str(consumer.state)
    return name, "running" if live else "orphaned"


def copy_progress(
    db: Database,
    conn: Connection,
    token: ConsistencyToken,
    name: str,
    *,
    topics: Sequence[str],
    types: Sequence[str],
    position: int,
    state: str,
) -> Progress:
    """:func:`progress` for one instance's copy of an in-memory consumer: applied in order
    up to ``position`` (one "partition", 0), ``state`` its copy's (``running``, ``paused``,
    ``halted``: refused when behind)."""
    if token.tenant != db.tenant:
        raise InvalidToken(
            f"it was issued for tenant {token.tenant!r}, this database serves {db.tenant!r}"
        )
    uncommitted = _check_marks(db, conn, token)
    behind = [Behind("", None, p, 0, None, None, UNCOMMITTED) for p in uncommitted]
    bound = max(
        (p for topic, _, p in token.marks if topic in topics and p not in uncommitted), default=0
    )
    copy = _Consumer(name, state, 1, tuple(topics), tuple(types))
    if position < bound and _pending(db, conn, copy, 0, position, bound):
        if state != "running":
            raise WaitRefused(f"this instance's copy of {name} is {state}: it applies nothing")
        lag = _lag(db, conn, copy, 0, position, bound)
        behind.append(Behind(name, 0, bound, position, lag, None, "in memory, running"))
    return Progress(tuple(behind))
