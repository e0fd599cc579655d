"""A database that refuses writes is told apart, said in words a user acts on (naming the
file or the server), and is one outage: one WARNING, nothing per retry, one INFO when it
takes writes again."""

from __future__ import annotations

import logging
import sqlite3
import time

import pymysql
import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError

from messaging.applying._outage import Heartbeats, Outage
from messaging.store._refusals import FAILING, FULL, READ_ONLY, refusal, refusal_words


def _sqlite(message: str) -> OperationalError:
    return OperationalError("UPDATE x", {}, sqlite3.OperationalError(message))


def _mysql(code: int, message: str) -> OperationalError:
    return OperationalError("UPDATE x", {}, pymysql.err.OperationalError(code, message))


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (_sqlite("database or disk is full"), FULL),
        (_sqlite("disk I/O error"), FAILING),
        (_sqlite("attempt to write a readonly database"), READ_ONLY),
        (_mysql(1114, "The table 'prj_messages' is full"), FULL),
        (_mysql(1021, "Disk full (/var/lib/mysql); waiting for someone to free space"), FULL),
        (_mysql(1290, "The MariaDB server is running with the --read-only option"), READ_ONLY),
        (_mysql(1836, "Running in read-only mode"), READ_ONLY),
        (_sqlite("database is locked"), None),
        (_mysql(2013, "Lost connection to server during query"), None),
        (IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE constraint failed")), None),
        (ValueError("a handler's own error"), None),
    ],
)
def test_refusals_are_told_apart(error: BaseException, kind: str | None) -> None:
    assert refusal(error) == kind


def test_the_words_name_the_file_or_the_server() -> None:
    sqlite, mysql = make_url("sqlite:////data/app.db"), make_url("mysql://u@db.example:3307/x")
    assert refusal_words(FULL, sqlite) == "the disk holding /data/app.db is full"
    assert refusal_words(FAILING, sqlite).startswith("the disk holding /data/app.db fails")
    assert refusal_words(READ_ONLY, sqlite).startswith("/data/app.db is read-only")
    assert refusal_words(FULL, mysql).startswith("the server db.example:3307 has no space left")
    assert refusal_words(READ_ONLY, mysql).startswith("the server db.example:3307 is read-only")
    assert refusal_words(FULL, None) == "the database's disk is full"


def test_a_refusal_is_one_outage_said_in_words(caplog: pytest.LogCaptureFixture) -> None:
    heartbeats = Heartbeats("x", 30.0, create_engine("sqlite:////data/app.db"))
    outage = Outage("instance x", heartbeats)
    full = _sqlite("database or disk is full")
    with caplog.at_level(logging.INFO, logger="messaging.runtime.outage"):
        assert all(outage.failed(full) for _ in range(50))  # every poll, every heartbeat
        during = outage.cause
        outage.settle = 0.0
        outage.succeeded()
    full_disk = "the database refuses writes: the disk holding /data/app.db is full"
    assert (during, outage.cause) == (full_disk, None)
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert messages[0] == (
        "WARNING",
        "instance x: the database refuses writes: the disk holding /data/app.db is full; "
        "retrying quietly until it takes writes again (OperationalError: database or disk "
        "is full)",
    )
    assert len(messages) == 2
    assert messages[1][0] == "INFO"
    assert messages[1][1].startswith("instance x: database takes writes again after ")


def test_only_a_write_ends_a_refusal_of_writes() -> None:
    """Reads go on while writes are refused: a round that only read ends no refusal, one
    after a heartbeat went through (a write) does, as does a poll that applied."""
    heartbeats = Heartbeats("x", 30.0)
    outage = Outage("instance x", heartbeats)
    outage.settle = 0.0
    assert outage.failed(_mysql(1290, "running with the --read-only option"))
    outage.succeeded(wrote=False)
    still = outage.down
    heartbeats.beat(time.monotonic())
    outage.succeeded(wrote=False)
    assert (still, outage.down) == (True, False)
    assert outage.failed(_mysql(1114, "The table is full"))
    outage.succeeded()
    assert not outage.down
