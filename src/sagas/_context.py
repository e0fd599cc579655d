"""What a saga handler receives: its instance's state, and ways to end, send and schedule.

:class:`SagaContext` is a :class:`messaging.applying._context.MessageContext` (the same
``envelope``, ``connection``, ``execute``, ``upsert``, ``send`` and ``append`` as any handler's
context) extended with the saga's own: ``key``, ``state``, ``now``, ``end``, ``schedule``
and ``cancel``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.sql import Executable

from messaging import Envelope, HandlerContext, MessageContext, ProjectionsError, Sent, Written

_NONE_CANCELLED: frozenset[str] = frozenset()
"""What ``cancelled`` is until a deadline is cancelled: most instances never cancel one,
and a batch holds hundreds of them (no set each for the garbage collector to walk)."""


class SagaContext(MessageContext):
    """One saga instance as a handler sees it, inside the batch's transaction.

    ``state`` is None when a :func:`sagas.start` handler is called for a new instance;
    the handler sets it. Messages sent, deadlines scheduled or cancelled and the end
    of the instance all commit with the checkpoint, or not at all.
    """

    __slots__ = ("_ctx", "cancelled", "ended", "key", "now", "scheduled", "state")

    def __init__(self, ctx: HandlerContext, key: str, state: Any, now: float) -> None:
        self._ctx = ctx
        self.key = key
        """The instance's correlation key."""
        self.state = state
        self.now = now
        """The database's time at the start of the batch, in seconds since the epoch."""
        self.ended = False
        self.scheduled: dict[str, tuple[float, object]] = {}
        """Deadlines scheduled here: name → (due time, message)."""
        self.cancelled: set[str] | frozenset[str] = _NONE_CANCELLED
        """Names of the deadlines cancelled here."""

    def end(self) -> None:
        """End this instance: its deadlines are cancelled and later messages ignored."""
        self.ended = True

    def schedule(
        self,
        message: object,
        *,
        after: float | None = None,
        at: float | None = None,
        name: str | None = None,
    ) -> str:
        """Deliver ``message`` to this instance ``after`` seconds (or ``at`` an epoch time),
        exactly once, unless cancelled first. One deadline per ``name`` (by default the
        message's class name): scheduling it again moves it. Returns the name."""
        if (after is None) == (at is None):
            raise ProjectionsError("schedule a deadline with exactly one of after= or at=")
        name = name or type(message).__name__
        due = at if at is not None else self.now + float(after)  # type: ignore[arg-type]
        self.scheduled[name] = (due, message)
        if name in self.cancelled:
            self._cancelled().discard(name)
        return name

    def cancel(self, name: str | type) -> None:
        """Cancel the deadline ``name`` (or named after a message class) if it is pending."""
        key = name.__name__ if isinstance(name, type) else name
        self.scheduled.pop(key, None)
        self._cancelled().add(key)

    def _cancelled(self) -> set[str]:
        """``cancelled`` as a set of its own, to change."""
        if not isinstance(self.cancelled, set):
            self.cancelled = set()
        return self.cancelled

    def send(
        self,
        destination: str,
        message: object,
        *,
        key: str | None = None,
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> Sent:
        """Send a command to ``destination`` when the batch commits (see HandlerContext.send)."""
        return self._ctx.send(destination, message, key=key, message_id=message_id, headers=headers)

    def append(
        self,
        topic: str,
        source: str,
        message: object,
        *,
        headers: Mapping[str, Any] | None = None,
    ) -> Written:
        """Append an event of ``source`` to ``topic`` when the batch commits (see
        HandlerContext.append)."""
        return self._ctx.append(topic, source, message, headers=headers)

    def execute(self, statement: Executable, params: Mapping[str, Any] | None = None) -> None:
        """Write to the saga's own tables in the batch's transaction (buffered)."""
        self._ctx.execute(statement, params)

    def upsert(
        self,
        table: Table,
        key: Mapping[str, Any],
        *,
        set: Mapping[str, Any] | None = None,
        add: Mapping[str, Any] | None = None,
        insert: Mapping[str, Any] | None = None,
    ) -> None:
        """Insert or change a row of the saga's own tables (see HandlerContext.upsert)."""
        self._ctx.upsert(table, key, set=set, add=add, insert=insert)

    @property
    def connection(self) -> Connection:
        """The batch's connection, buffered writes sent."""
        return self._ctx.connection

    @property
    def envelope(self) -> Envelope:
        """The envelope of the message being handled (a deadline has none)."""
        if self._ctx.cause is not None:
            raise ProjectionsError("a deadline being delivered has no envelope")
        return self._ctx.envelope
