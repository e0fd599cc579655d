"""What a handler receives beside its message: the envelope and the batch's transaction.

Writes given to :meth:`HandlerContext.execute` are buffered and sent when the batch
commits, consecutive uses of one statement grouped into a single ``executemany``: the
read-model writes of a batch cost a few round trips, not one per message. Reading
:attr:`HandlerContext.connection` sends the buffer first, so a handler always reads
its own writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.sql import Executable

from messaging.errors import ProjectionsError
from messaging.messages import Envelope


class HandlerContext:
    """The current message's envelope and, for transactional consumers, its transaction."""

    __slots__ = ("_conn", "_params", "_runs", "_statement", "envelope", "immediate")

    def __init__(self, conn: Connection | None, *, immediate: bool = False) -> None:
        self._conn = conn
        self._runs: list[tuple[Executable, list[Mapping[str, Any]]]] = []
        self._statement: Executable | None = None
        self._params: list[Mapping[str, Any]] = []
        self.immediate = immediate
        """Send every write at once (used to find which message a failing batch broke on)."""
        self.envelope: Envelope | None = None

    def execute(self, statement: Executable, params: Mapping[str, Any] | None = None) -> None:
        """Run ``statement`` with ``params`` in the batch's transaction (buffered)."""
        if self._conn is None:
            raise ProjectionsError("this consumer is not transactional: it has no database writes")
        if statement is not self._statement:
            if self._statement is not None:
                self._runs.append((self._statement, self._params))
            self._statement = statement
            self._params = []
        self._params.append(params or {})
        if self.immediate:
            self.flush()

    @property
    def connection(self) -> Connection:
        """The batch's connection, with every buffered write sent."""
        if self._conn is None:
            raise ProjectionsError("this consumer is not transactional: it has no connection")
        self.flush()
        return self._conn

    def flush(self) -> None:
        """Send the buffered writes in order."""
        if self._statement is not None:
            self._runs.append((self._statement, self._params))
            self._statement = None
            self._params = []
        runs, self._runs = self._runs, []
        assert self._conn is not None or not runs
        for statement, params in runs:
            if len(params) == 1:
                self._conn.execute(statement, params[0])  # type: ignore[union-attr]
            else:
                self._conn.execute(statement, params)  # type: ignore[union-attr]
