"""PyMySQL builds no TLS context for a server known to offer no TLS (messaging.store._tls)."""

from __future__ import annotations

import socket
import time

import pymysql
import pytest
from pymysql.constants import CLIENT

from messaging import Database
from messaging.store._tls import SkipTlsWhereNone


def test_connections_after_the_first_skip_tls_only_where_the_server_offers_none(
    db: Database,
) -> None:
    """The first connection tries TLS (PyMySQL's preference); a second one, opened while
    the first is held, skips the set-up exactly when the server offered no TLS."""
    first = db.engine.raw_connection()
    second = db.engine.raw_connection()
    try:
        offered = bool(first.dbapi_connection.server_capabilities & CLIENT.SSL)  # type: ignore[union-attr]
        assert second.dbapi_connection.ssl is offered  # type: ignore[union-attr]
        cursor = second.cursor()  # and it works
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
        cursor.close()
    finally:
        second.close()
        first.close()


def test_tls_options_of_the_url_and_a_server_offering_tls_are_left_alone(
    db: Database,
) -> None:
    """Only a server known to offer no TLS gets a connection without TLS set-up; the
    URL's own TLS options, or a server offering TLS or not known yet, leave SQLAlchemy
    to connect as usual."""
    dialect = db.engine.dialect
    _, params = dialect.create_connect_args(db.engine.url)
    skip = SkipTlsWhereNone()
    for offered in (None, True):
        skip.offered = offered
        assert skip.connect(dialect, None, (), dict(params)) is None
    skip.offered = False
    assert skip.connect(dialect, None, (), {**params, "ssl_disabled": False}) is None
    plain = skip.connect(dialect, None, (), dict(params))
    try:
        assert plain.ssl is False
    finally:
        plain.close()


def test_a_connection_refused_without_tls_is_made_again_the_usual_way(db: Database) -> None:
    """A server that refuses the connection made without TLS (say, it now requires TLS;
    here: an unknown user) is not taken to offer none any more: SQLAlchemy connects as
    usual."""
    dialect = db.engine.dialect
    _, params = dialect.create_connect_args(db.engine.url)
    skip = SkipTlsWhereNone()
    skip.offered = False
    refused = {**params, "user": "no-such-user", "password": "wrong"}
    assert skip.connect(dialect, None, (), refused) is None
    assert skip.offered is None


def test_a_connection_nobody_answers_fails_once(db: Database) -> None:
    """A connection without TLS that gets no answer (a server that accepts and says
    nothing, as a frozen one) fails as it is, after one read timeout: connecting the usual
    way would wait as long again."""
    dialect = db.engine.dialect
    _, params = dialect.create_connect_args(db.engine.url)
    skip = SkipTlsWhereNone()
    skip.offered = False
    with socket.create_server(("127.0.0.1", 0)) as silent:  # never accepts: the kernel does
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(pymysql.err.OperationalError) as unanswered:
            skip.connect(dialect, None, (), {**params, "port": port, "read_timeout": 0.5})
    assert unanswered.value.args[0] == 2013
    assert time.monotonic() - started < 1.0
    assert skip.offered is False


def test_what_the_server_offered_is_learnt_from_each_connection() -> None:
    class Connection:
        def __init__(self, capabilities: int) -> None:
            self.server_capabilities = capabilities

    def offered_after(skip: SkipTlsWhereNone, connection: object) -> bool | None:
        skip.connected(connection, None)
        return skip.offered

    skip = SkipTlsWhereNone()
    assert offered_after(skip, Connection(CLIENT.PROTOCOL_41)) is False
    # the server enabled TLS since: used again
    assert offered_after(skip, Connection(CLIENT.PROTOCOL_41 | CLIENT.SSL)) is True
    assert offered_after(skip, object()) is True  # a driver that does not say: nothing learnt
