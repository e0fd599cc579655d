"""An outage's edges: one WARNING when the database goes, one INFO when it is back; the
sessions of an instance taken for stale, ended by its successor, are said once instead."""

from __future__ import annotations

import logging
import time

import pymysql
import pytest
from sqlalchemy.exc import OperationalError

from messaging.applying._outage import Heartbeats, Outage

REFUSED = OperationalError("SELECT 1", {}, pymysql.err.OperationalError(2003, "refused"))
LOST = OperationalError("SELECT 1", {}, pymysql.err.OperationalError(2013, "Lost connection"))
STALE_AT_ONCE = -1.0
"""A stale-instance-timeout every heartbeat is past at once: as if the instance had been
frozen since its last one."""
ENDED = "instance x: no heartbeat for"


def test_a_success_as_the_server_goes_down_does_not_split_the_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection opened before may answer once as the server goes down: within
    ``settle`` of the first failure that success does not end the outage, so the failures
    after it start no second one; a success after that ends it, logged once."""
    outage = Outage("instance x")
    with caplog.at_level(logging.INFO, logger="messaging.runtime.outage"):
        assert outage.failed(REFUSED)
        outage.succeeded()  # too early to tell
        still_down = outage.down
        assert outage.failed(REFUSED)
        outage.settle = 0.0  # as if the settling second had passed
        outage.succeeded()
        outage.succeeded()
    assert (still_down, outage.down) == (True, False)
    messages = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records]
    assert messages == [
        ("WARNING", "instance x: database unreachable"),
        ("INFO", messages[1][1]),
    ]
    assert "reachable again after" in messages[1][1]


def _messages(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records]


def _beaten(stale_instance_timeout: float) -> Heartbeats:
    """The heartbeats of instance ``x``, one of which went through."""
    heartbeats = Heartbeats("x", stale_instance_timeout)
    heartbeats.beat(time.monotonic())
    return heartbeats


def test_lost_connections_of_an_instance_taken_for_stale_are_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without a heartbeat past stale-instance-timeout, lost connections are the sessions
    the successor ended: one WARNING for the instance's loops together (its work and its
    heartbeat), never "unreachable", and no "reachable again" when it works again."""
    heartbeats = _beaten(STALE_AT_ONCE)
    work, beat = Outage("instance x", heartbeats), Outage("instance x heartbeat", heartbeats)
    with caplog.at_level(logging.INFO, logger="messaging.runtime.outage"):
        assert work.failed(LOST) and beat.failed(LOST) and work.failed(LOST)
        work.settle = beat.settle = 0.0  # as if the settling second had passed
        work.succeeded()
        beat.succeeded()
    [(level, message)] = _messages(caplog)
    assert level == "WARNING" and message.startswith(ENDED)
    assert "taken for stale, its database sessions were ended by the instance" in caplog.text
    assert not (work.down or beat.down)


def test_failures_that_go_on_after_the_sessions_ended_are_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """New sessions failing too, past ``settle``: the database is unreachable as well,
    said then, with its end."""
    outage = Outage("instance x", _beaten(STALE_AT_ONCE))
    with caplog.at_level(logging.INFO, logger="messaging.runtime.outage"):
        assert outage.failed(LOST)
        outage.settle = 0.0
        assert outage.failed(REFUSED) and outage.failed(REFUSED)
        outage.succeeded()
    messages = _messages(caplog)
    assert [level for level, _ in messages] == ["WARNING", "WARNING", "INFO"]
    assert messages[0][1].startswith(ENDED)
    assert messages[1][1] == "instance x: database unreachable"
    assert "reachable again after" in messages[2][1]


@pytest.mark.parametrize(
    ("stale_instance_timeout", "error"), [(1000.0, LOST), (STALE_AT_ONCE, REFUSED)]
)
def test_an_outage_is_an_outage_when_the_heartbeat_is_fresh_or_no_session_was_lost(
    caplog: pytest.LogCaptureFixture, stale_instance_timeout: float, error: Exception
) -> None:
    """A connection lost by an instance whose heartbeat is fresh, or a refused one, is the
    database's outage as before."""
    outage = Outage("instance x", _beaten(stale_instance_timeout))
    with caplog.at_level(logging.INFO, logger="messaging.runtime.outage"):
        assert outage.failed(error)
    assert _messages(caplog) == [("WARNING", "instance x: database unreachable")]


def test_a_gap_counts_from_when_the_last_heartbeat_was_sent_not_from_its_late_answer() -> None:
    """The peers judge by the time the heartbeat's row records: a heartbeat whose answer
    came 1.5 s after it was sent leaves an instance with a 1 s timeout already stale to
    them, so a connection lost now is one of the sessions they ended (not an outage)."""
    heartbeats = Heartbeats("x", 1.0)
    heartbeats.beat(time.monotonic() - 1.5)
    assert heartbeats.sessions_ended(LOST)
    assert heartbeats.beaten_since(time.monotonic() - 0.5)  # its answer came just now
