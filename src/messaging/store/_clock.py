"""Where "now" comes from: the database's clock in production, a settable one in tests.

Liveness is judged by comparing heartbeats in SQL, so every timestamp the protocol
writes or compares is produced by :meth:`Clock.now` as an SQL expression. With the
database clock, skew between hosts cannot make a live instance look dead.
"""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import Float, bindparam, literal, literal_column
from sqlalchemy.sql.elements import BindParameter, ColumnElement

_NOW_SQL = {
    # julianday() has sub-millisecond resolution, unlike CURRENT_TIMESTAMP.
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
    "mysql": "UNIX_TIMESTAMP(NOW(6))",
    "mariadb": "UNIX_TIMESTAMP(NOW(6))",
}


class Clock(Protocol):
    """Gives the current time, in seconds since the Unix epoch, as an SQL expression."""

    def now(self) -> ColumnElement[float]:
        """An SQL expression evaluating to the current time in seconds."""
        ...

    def __hash__(self) -> int:
        """By identity, as objects are: statements built once are kept per clock."""
        ...


class DatabaseClock:
    """The database server's clock: one clock for every host sharing the database."""

    def __init__(self, dialect_name: str) -> None:
        try:
            self._expression = literal_column(_NOW_SQL[dialect_name], Float)
        except KeyError:
            raise ValueError(f"no clock expression for dialect {dialect_name!r}") from None

    def now(self) -> ColumnElement[float]:
        return self._expression


class ManualClock:
    """A clock that moves only when told to: for unit and property tests."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.value = start

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        self.value += seconds

    def now(self) -> ColumnElement[float]:
        return literal(self.value, Float)


NOW_PARAMETER = "now"
"""The parameter a cached statement binds a manual clock's time to."""


def cached_now(clock: Clock) -> ColumnElement[float]:
    """``clock``'s now for a statement built once and run many times: the server's clock
    as it is, a clock whose now is a value (a manual one) as the parameter
    :data:`NOW_PARAMETER`, to be given :func:`now_params` at each run."""
    now = clock.now()
    return bindparam(NOW_PARAMETER, type_=now.type) if isinstance(now, BindParameter) else now


def now_params(clock: Clock) -> dict[str, Any]:
    """The parameters a statement built with :func:`cached_now` takes now."""
    now = clock.now()
    return {NOW_PARAMETER: now.value} if isinstance(now, BindParameter) else {}
