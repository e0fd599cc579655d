"""``projections append``: JSON lines ``{"topic", "source", "type", "payload"}`` into the store.

Lines are validated a batch at a time before anything is written; a bad line is
reported with its line number and nothing of its batch is written (earlier batches
stay committed, and the error says how many lines they held).

A batch whose commit acknowledgement is lost (the connection dropped during COMMIT) is
never stored twice: every line gets a ``message-id`` header (unless it has one), and the
retry expects the very source versions the first attempt wrote after. A
:class:`VersionConflict` on the retry is checked against the messages stored at the
first attempt's positions: if they are the ones sent, the first attempt committed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

import attrs
from sqlalchemy import Connection, func, select

from messaging.errors import ProjectionsError, VersionConflict
from messaging.messages import MESSAGE_ID_HEADER, MessageRegistry
from messaging.runtime.retry import retry_transient
from messaging.settings import ConflictRetrySettings
from messaging.store.database import Database
from messaging.store.store import MessageStore, NewMessage

_REQUIRED = ("topic", "source", "type", "payload")
_ALLOWED = {*_REQUIRED, "headers"}


class AppendError(ProjectionsError, ValueError):
    """A line of input cannot be appended; carries its line number."""

    def __init__(self, line: int, reason: str, written: int) -> None:
        super().__init__(
            f"line {line}: {reason} (nothing of its batch was written; "
            f"{written} earlier lines were appended)"
        )
        self.line = line
        self.written = written


class _NotText(ValueError):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line


def utf8_lines(stream: Iterable[bytes]) -> Iterator[str]:
    """The lines of a binary stream as text; a line that is not UTF-8 stops the input with
    an error naming it (raised by :func:`append_lines` as an :class:`AppendError`)."""
    for number, raw in enumerate(stream, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _NotText(number, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_line(number: int, text: str, registry: MessageRegistry | None) -> NewMessage:
    """One JSON line as a :class:`NewMessage`; ValueError says what is wrong with it."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise ValueError(f"missing key(s) {', '.join(missing)}")
    unknown = sorted(set(data) - _ALLOWED)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}")
    for key in ("topic", "source", "type"):
        if not isinstance(data[key], str) or not data[key]:
            raise ValueError(f"{key!r} must be a non-empty string")
    if not isinstance(data["payload"], dict):
        raise ValueError("'payload' must be a JSON object")
    headers = data.get("headers")
    if headers is not None and not isinstance(headers, dict):
        raise ValueError("'headers' must be a JSON object")
    payload = json.dumps(data["payload"], separators=(",", ":"))
    if registry is not None:
        registry.decode(data["type"], payload)  # DecodeError names the type and the reason
    return NewMessage(
        topic=data["topic"],
        source=data["source"],
        type=data["type"],
        payload=payload,
        headers=headers,
    )


def _batches(lines: Iterable[str], size: int) -> Iterator[list[tuple[int, str]]]:
    batch: list[tuple[int, str]] = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            batch.append((number, line))
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def append_lines(
    db: Database,
    stream: Iterable[str] | IO[str],
    *,
    batch_size: int = 1000,
    registry: MessageRegistry | None = None,
    retry: ConflictRetrySettings | None = None,
) -> int:
    """Append every line of ``stream`` (text; :func:`utf8_lines` reads a binary one), in
    transactions of ``batch_size`` lines; return how many messages were appended. Each
    batch commits once, also when an acknowledgement is lost (retried per ``retry``)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be 1 or more, got {batch_size}")
    store = MessageStore(db)
    written = 0
    try:
        for batch in _batches(stream, batch_size):
            messages = []
            for number, line in batch:
                try:
                    messages.append(parse_line(number, line, registry))
                except (ValueError, ProjectionsError) as exc:
                    raise AppendError(number, str(exc), written) from None
            append_once(db, store, messages, retry or ConflictRetrySettings())
            written += len(messages)
    except _NotText as exc:
        raise AppendError(exc.line, str(exc), written) from None
    return written


def _identified(message: NewMessage) -> NewMessage:
    """``message`` with a ``message-id`` header (a new one unless it has one)."""
    headers = dict(message.headers or {})
    headers.setdefault(MESSAGE_ID_HEADER, uuid.uuid4().hex)
    return attrs.evolve(message, headers=headers)


def _stored(conn: Connection, db: Database, positions: Sequence[int]) -> list[tuple[Any, ...]]:
    m = db.schema.messages
    rows = conn.execute(
        select(m.c.topic, m.c.source, m.c.type, m.c.payload, m.c.headers)
        .where(m.c.tenant == db.tenant, m.c.position.in_(positions))
        .order_by(m.c.position)
    )
    return [(r[0], r[1], r[2], r[3], json.loads(r[4] or "{}")) for r in rows]


def append_once(
    db: Database, store: MessageStore, messages: Sequence[NewMessage], retry: ConflictRetrySettings
) -> None:
    """Append ``messages`` in one transaction, retried on transient errors without ever
    storing them twice: after the first attempt has reached its COMMIT, retries expect
    the source versions it appended after, and a :class:`VersionConflict` then counts as
    success only if the first attempt's positions hold exactly these messages (by
    message id)."""
    sent = [_identified(m) for m in messages]
    wanted = [(m.topic, m.source, m.type, m.payload, m.headers) for m in sent]
    first: dict[str, Any] = {}
    """The expected versions of the first attempt to reach its COMMIT, and the positions of
    the latest."""
    m = db.schema.messages

    def attempt() -> None:
        with db.transaction() as conn:
            try:
                positions = store.append_encoded(
                    conn, sent, expected_versions=first.get("expected")
                )
            except VersionConflict:
                if "positions" in first and _stored(conn, db, first["positions"]) == wanted:
                    return  # the first attempt committed; its acknowledgement was lost
                raise
            first["positions"] = positions  # of the latest attempt to reach its COMMIT
            if "expected" not in first:
                rows = conn.execute(
                    select(m.c.topic, m.c.source, func.min(m.c.version))
                    .where(
                        m.c.tenant == db.tenant,
                        m.c.position.between(positions[0], positions[-1]),
                    )
                    .group_by(m.c.topic, m.c.source)
                )
                first["expected"] = {(t, src): int(v) - 1 for t, src, v in rows}

    retry_transient(attempt, retry, what="append")
