"""A one-shot command's transaction retries waits (lost or unanswered connections, lock
waits) only for COMMAND_PATIENCE answer bounds, then gives up naming the database and the
time waited; deadlocks and certification conflicts keep their count
(:func:`messaging.store._retry.retry_command`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pymysql
import pytest
from sqlalchemy.exc import OperationalError

import messaging.store._committed as committed
from messaging import Database, MessageStore, Unanswered
from messaging._settings import ConflictRetrySettings
from messaging.operations import append_committed
from messaging.store._retry import COMMAND_PATIENCE, for_command, retry_command
from projections._appending import parse_line

BOUND = 15.0
SETTINGS = for_command(ConflictRetrySettings(max_delay=0.001))


def _mysql(code: int) -> OperationalError:
    return OperationalError("COMMIT", {}, pymysql.err.OperationalError(code, "x"))


class _Db:
    """What retry_command asks of a database."""

    safe_url = "mysql+pymysql://app:***@db1:3306/app"

    def __init__(self, answer_timeout: float | None) -> None:
        self.answer_timeout = answer_timeout


class _Clock:
    """Time that moves only when an attempt spends some."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _failing(clock: _Clock, errors: list[OperationalError], spends: float) -> Any:
    def action() -> str:
        clock.now += spends
        if errors:
            raise errors.pop(0)
        return "done"

    return action


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(time, "monotonic", fake)
    return fake


@pytest.mark.parametrize("code", [2013, 1205])
def test_waits_are_retried_for_the_patience_then_named(clock: _Clock, code: int) -> None:
    errors = [_mysql(code) for _ in range(10)]
    with pytest.raises(Unanswered) as gave_up:
        retry_command(_failing(clock, errors, BOUND), _Db(BOUND), SETTINGS, what="append")
    assert gave_up.value.attempts == COMMAND_PATIENCE
    assert gave_up.value.waited == COMMAND_PATIENCE * BOUND
    assert gave_up.value.outcome_unknown is (code == 2013)
    assert str(gave_up.value) == (
        f"append gave up after 30.0s and 2 attempt(s) waiting for database "
        f"mysql+pymysql://app:***@db1:3306/app: ({code}, 'x')"
        + (" (it may have committed)" if code == 2013 else "")
    )


def test_a_quick_wait_after_a_long_one_is_retried_within_the_patience(clock: _Clock) -> None:
    errors = [_mysql(2013), _mysql(2013)]
    action = _failing(clock, errors, BOUND / 2)
    assert retry_command(action, _Db(BOUND), SETTINGS, what="append") == "done"


def test_deadlocks_keep_their_count_past_the_patience(clock: _Clock) -> None:
    errors = [_mysql(1213) for _ in range(5)]
    action = _failing(clock, errors, BOUND)
    assert retry_command(action, _Db(BOUND), SETTINGS, what="append") == "done"
    assert clock.now == 6 * BOUND


def test_without_a_bound_waits_keep_their_count(clock: _Clock) -> None:
    errors = [_mysql(2013) for _ in range(60)]
    with pytest.raises(OperationalError):
        retry_command(_failing(clock, errors, BOUND), _Db(None), SETTINGS, what="append")
    assert len(errors) == 60 - SETTINGS.max_retries - 1


def test_a_connection_lost_after_the_positions_before_the_commit_appends_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lost while reading the versions the batch appended after (it used to fail with a
    KeyError: the retry found the positions of that attempt but not its versions)."""
    db = Database(f"sqlite:///{tmp_path / 'app.db'}")
    db.prepare()
    read = committed._versions_before
    lost = [OperationalError("SELECT", {}, Exception("lost"), connection_invalidated=True)]

    def versions_before(*args: Any) -> Any:
        if lost:
            raise lost.pop()
        return read(*args)

    monkeypatch.setattr(committed, "_versions_before", versions_before)
    line = '{"topic": "t", "source": "s", "type": "x", "payload": {}}'
    append_committed(MessageStore(db), [parse_line(1, line, None)])
    assert not lost
    with db.read() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM prj_messages").scalar() == 1
    db.dispose()


def test_a_command_that_only_reads_waits_one_bound_and_says_the_database_did_not_answer(
    clock: _Clock,
) -> None:
    """A report's set-up and reads (``projections health``): one answer bound, and never
    "it may have committed", though a lost connection ended the wait."""
    errors = [_mysql(2013) for _ in range(10)]
    with pytest.raises(Unanswered) as gave_up:
        retry_command(
            _failing(clock, errors, BOUND), _Db(BOUND), SETTINGS, what="prepare", reads_only=True
        )
    assert (gave_up.value.attempts, gave_up.value.waited) == (1, BOUND)
    assert str(gave_up.value) == (
        "database mysql+pymysql://app:***@db1:3306/app did not answer prepare within 15.0s "
        "(1 attempt(s): (2013, 'x'))"
    )
