"""Errors of unknown outcome are told apart from other transient errors, and their retries
re-read first and are logged at WARNING."""

from __future__ import annotations

import logging

import pymysql
import pytest
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

from messaging._settings import ConflictRetrySettings
from messaging.store import _retry as retry
from messaging.store._retry import is_ambiguous, is_transient, retry_transient


def _mysql(code: int, cls: type = OperationalError) -> Exception:
    error: Exception = cls("COMMIT", {}, pymysql.err.OperationalError(code, "x"))
    return error


@pytest.mark.parametrize(
    ("error", "ambiguous", "transient"),
    [
        (_mysql(2013), True, True),  # lost connection during query (the COMMIT)
        (_mysql(2006), True, True),  # server has gone away
        (_mysql(0, InterfaceError), True, True),  # PyMySQL: connection already closed
        (_mysql(1213), False, True),  # deadlock: rolled back for sure
        (_mysql(1205), False, True),  # lock wait timeout
        (_mysql(1062, IntegrityError), False, False),
        (ValueError("no database at all"), False, False),
    ],
)
def test_errors_of_unknown_outcome(error: Exception, ambiguous: bool, transient: bool) -> None:
    assert (is_ambiguous(error), is_transient(error)) == (ambiguous, transient)


def test_a_retry_after_an_ambiguous_error_rereads_first_and_warns(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retry, "_LOST", retry._Storm())  # no storm from earlier tests
    calls: list[str] = []
    errors = [_mysql(1213), _mysql(2013)]

    def action() -> str:
        calls.append("attempt")
        if errors:
            raise errors.pop(0)
        return "done"

    result = retry_transient(
        action,
        ConflictRetrySettings(max_retries=3, max_delay=0.01),
        what="apply x",
        sleep=lambda _delay: None,
        reread=lambda _error: calls.append("reread"),
    )
    assert result == "done"
    assert calls == ["attempt", "attempt", "reread", "attempt"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "outcome unknown" in warnings[0]
    assert "(2013, 'x')" in warnings[0] and "SQL" not in warnings[0]  # the driver's error
    assert "\n" not in warnings[0]


def test_a_reread_that_finds_the_commit_gives_the_retry_up() -> None:
    class Committed(Exception):
        pass

    def reread(_error: BaseException) -> None:
        raise Committed

    def action() -> None:
        raise _mysql(2013)

    with pytest.raises(Committed):
        retry_transient(
            action,
            ConflictRetrySettings(max_retries=3, max_delay=0.01),
            what="apply x",
            sleep=lambda _delay: None,
            reread=reread,
        )


def test_a_storm_of_lost_connections_warns_once_per_window() -> None:
    """Every loop loses its connection at once when the network goes: the first says so at
    WARNING, the others within the window at INFO, and the next storm warns again."""
    storm = retry._Storm()
    assert [storm.level() for _ in range(3)] == [logging.WARNING, logging.INFO, logging.INFO]
    storm.window = 0.0
    assert storm.level() == logging.WARNING
