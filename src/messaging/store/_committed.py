"""An append an application can trust: its own transaction, committed, retried as a
one-shot command's (:func:`~messaging.store._retry.retry_command`: certification conflicts,
deadlocks and lock waits retried, a database that does not answer given up within two
answer bounds with :class:`~messaging._errors.Unanswered`), and never stored twice.

Every message gets a ``message-id`` header (unless it has one). Once an attempt has failed
with an outcome unknown (its connection lost during COMMIT, a Galera node leaving the
primary component), the retries expect the source versions that attempt appended after,
and a :class:`~messaging._errors.VersionConflict` then counts as success only if the
positions of such an attempt hold exactly these messages (by message id): its
acknowledgement was lost, not its commit. An attempt that certainly failed (a deadlock,
Galera's certification conflict at COMMIT) binds nothing: the retry appends afresh.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs
from sqlalchemy import Connection, func, select

from messaging._errors import VersionConflict
from messaging._messages import MESSAGE_ID_HEADER
from messaging._settings import ConflictRetrySettings
from messaging.store._database import Database
from messaging.store._retry import for_command, is_ambiguous, retry_command
from messaging.store._rows import NewMessage
from messaging.store._tokens import Appended

__all__ = ["append_committed"]

Expected = Mapping[tuple[str, str], int | None]


class Appending(Protocol):
    """What an append needs of the store (:class:`~messaging.store._store.MessageStore`)."""

    @property
    def db(self) -> Database: ...

    def append_encoded(
        self,
        conn: Connection,
        messages: Sequence[NewMessage],
        *,
        expected_versions: Expected | None = None,
    ) -> Appended: ...


def identified(message: NewMessage) -> NewMessage:
    """``message`` with a ``message-id`` header (a new one unless it has one)."""
    headers = dict(message.headers or {})
    headers.setdefault(MESSAGE_ID_HEADER, uuid.uuid4().hex)
    return attrs.evolve(message, headers=headers)


def append_committed(
    store: Appending,
    messages: Sequence[NewMessage],
    *,
    expected_versions: Expected | None = None,
    retry: ConflictRetrySettings | None = None,
) -> Appended:
    """Append ``messages`` in a transaction of their own and commit it (see the module);
    return the positions and token of the attempt that committed. ``expected_versions``:
    (topic, source) → the version the source must be at (0: new), as
    :meth:`~messaging.store._store.MessageStore.append` checks it; a conflict with
    another writer raises :class:`VersionConflict` at once."""
    db = store.db
    sent = [identified(m) for m in messages]
    wanted = [(m.topic, m.source, m.type, m.payload, m.headers) for m in sent]
    unknown: dict[str, Any] = {}
    """The expected versions of the first attempt of unknown outcome, and the positions of
    every such attempt (at most one of them committed: they all expected the same)."""
    latest: dict[str, Any] = {}
    """The expected versions and positions of the attempt in progress."""

    def attempt() -> Appended:
        latest.clear()
        expected = unknown.get("expected", expected_versions)
        with db.transaction() as conn:
            try:
                appended = store.append_encoded(conn, sent, expected_versions=expected)
            except VersionConflict:
                for earlier in unknown.get("positions", []):
                    if _stored(conn, db, earlier) == wanted:
                        committed: Appended = earlier  # its acknowledgement was lost
                        return committed
                raise
            bound = _versions_before(conn, db, appended)
            latest.update(positions=appended, expected=bound)  # together: see on_retry
        return appended

    def on_retry(exc: BaseException) -> None:
        if is_ambiguous(exc) and "positions" in latest:
            unknown.setdefault("expected", latest["expected"])
            unknown.setdefault("positions", []).append(latest["positions"])

    settings = for_command(retry or ConflictRetrySettings())
    return retry_command(attempt, db, settings, what="append", on_retry=on_retry)


def _stored(conn: Connection, db: Database, positions: Sequence[int]) -> list[tuple[Any, ...]]:
    m = db.schema.messages
    rows = conn.execute(
        select(m.c.topic, m.c.source, m.c.type, m.c.payload, m.c.headers)
        .where(m.c.tenant == db.tenant, m.c.position.in_(positions))
        .order_by(m.c.position)
    )
    return [(r[0], r[1], r[2], r[3], json.loads(r[4] or "{}")) for r in rows]


def _versions_before(
    conn: Connection, db: Database, positions: Sequence[int]
) -> dict[tuple[str, str], int]:
    """Each (topic, source) appended at ``positions`` → its version before them."""
    m = db.schema.messages
    rows = conn.execute(
        select(m.c.topic, m.c.source, func.min(m.c.version))
        .where(m.c.tenant == db.tenant, m.c.position.between(positions[0], positions[-1]))
        .group_by(m.c.topic, m.c.source)
    )
    return {(t, src): int(v) - 1 for t, src, v in rows}
