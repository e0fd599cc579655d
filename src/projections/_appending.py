"""``projections append``: JSON lines ``{"topic", "source", "type", "payload"}`` into the store.

A line may give the payload's ``version`` (by default its class's current one): an older
version is read through the upcasters to check it, and stored as given.

Lines are validated a batch at a time before anything is written; a bad line is
reported with its line number and nothing of its batch is written (earlier batches
stay committed, and the error says how many lines they held).

Each batch is appended as :meth:`MessageStore.append_committed` appends (see
:mod:`messaging.store._committed`): a batch whose commit acknowledgement is lost (the
connection dropped during COMMIT, or a Galera node left the primary component) is never
stored twice, and a deadlock or a Galera certification conflict is simply retried.

A database that stops answering ends the command within the budget of a one-shot command
(:func:`~messaging.store._retry.retry_command`): the error names the batch's lines, the
database, the time waited, whether the batch may have been stored, and how many lines
before it were.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

import attrs
from sqlalchemy import Connection, select

from messaging import (
    ConflictRetrySettings,
    ConsistencyToken,
    Database,
    MessageStore,
    NewMessage,
    ProjectionsError,
    Unanswered,
)
from messaging.kinds import MessageRegistry
from messaging.operations import append_committed

_REQUIRED = ("topic", "source", "type", "payload")
_ALLOWED = {*_REQUIRED, "headers", "version"}


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


def consumer_reads(
    db: Database, conn: Connection, names: Sequence[str] | None = None
) -> dict[str, tuple[set[str], set[str]]]:
    """Each declared consumer (of ``names``, or every one) → the topics it reads and the
    stored types it handles, as its row in the database says."""
    c = db.schema.consumers
    query = select(c.c.name, c.c.topics, c.c.types).where(c.c.tenant == db.tenant)
    if names is not None:
        query = query.where(c.c.name.in_(names))
    return {
        name: (set(json.loads(topics)), set(json.loads(types)))
        for name, topics, types in conn.execute(query)
    }


@attrs.frozen
class DeclaredTypes:
    """The message types the consumers declared in a database handle, by topic: what a
    line's type is checked against when no ``--module`` resolves it. A topic no consumer
    reads yet checks nothing."""

    by_topic: dict[str, set[str]]

    @classmethod
    def read(cls, db: Database) -> DeclaredTypes:
        by_topic: dict[str, set[str]] = {}
        with db.read() as conn:
            for topics, types in consumer_reads(db, conn).values():
                for topic in topics:
                    by_topic.setdefault(topic, set()).update(types)
        return cls(by_topic)

    def check(self, message: NewMessage) -> None:
        """ValueError when consumers read the message's topic and none handles its type."""
        handled = self.by_topic.get(message.topic)
        if handled is None or message.type in handled:
            return
        close = difflib.get_close_matches(message.type, sorted(handled), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"no consumer declared here handles type {message.type!r} on topic "
            f"{message.topic!r}{hint} (--module checks it against your classes; "
            "--allow-unknown-type appends it anyway)"
        )


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
    version = data.get("version")
    if version is None:
        version = 1 if registry is None else registry.version_of(data["type"])
    elif type(version) is not int or version < 1:
        raise ValueError(f"'version' must be an integer of at least 1, got {version!r}")
    payload = json.dumps(data["payload"], separators=(",", ":"))
    if registry is not None:
        # Read as a consumer would (upcast if older): DecodeError names the type and why.
        registry.reader(data["type"], version)(payload, None)
    return NewMessage(
        topic=data["topic"],
        source=data["source"],
        type=data["type"],
        payload=payload,
        headers=headers,
        payload_version=version,
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
    tokens: list[ConsistencyToken] | None = None,
    declared: DeclaredTypes | None = None,
) -> int:
    """Append every line of ``stream`` (text; :func:`utf8_lines` reads a binary one), in
    transactions of ``batch_size`` lines; return how many messages were appended (and add
    each batch's consistency token to ``tokens`` if given). Each
    batch commits once, also when an acknowledgement is lost (retried per ``retry`` as a
    one-shot command's transaction, :func:`~messaging.store._retry.retry_command`);
    :class:`ProjectionsError` naming its lines when the database does not answer. With a
    ``registry``, its upcasters are checked first (RegistrationError); with ``declared``,
    each line's type against what the consumers of its topic handle."""
    if registry is not None:
        registry.check_upcasters()
    if batch_size < 1:
        raise ValueError(f"batch_size must be 1 or more, got {batch_size}")
    store = MessageStore(db)
    written = 0
    try:
        for batch in _batches(stream, batch_size):
            messages = []
            for number, line in batch:
                try:
                    message = parse_line(number, line, registry)
                    if declared is not None:
                        declared.check(message)
                    messages.append(message)
                except (ValueError, ProjectionsError) as exc:
                    raise AppendError(number, str(exc), written) from None
            try:
                token = append_committed(store, messages, retry=retry).token
            except Unanswered as exc:
                lines = f"lines {batch[0][0]}-{batch[-1][0]}"
                raise ProjectionsError(
                    f"{lines}: {exc}; {written} earlier lines were appended"
                ) from exc
            written += len(messages)
            if tokens is not None:
                tokens.append(token)
    except _NotText as exc:
        raise AppendError(exc.line, str(exc), written) from None
    return written
