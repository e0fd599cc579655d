"""Several hosts in one MySQL URL against the test server: a refused node is passed over,
and a node lost mid-run moves the connections on with one log line."""

from __future__ import annotations

import logging
import socket

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from messaging import Database
from messaging._settings import ConflictRetrySettings
from messaging.store._retry import retry_transient

pytestmark = pytest.mark.mysql


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends: refused


def test_a_refused_node_is_passed_over(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    server = make_url(db.url)
    refused = _closed_port()
    url = server.set(host="127.0.0.1", port=refused).render_as_string(hide_password=False)
    multi = url.replace(f"127.0.0.1:{refused}", f"127.0.0.1:{refused},{server.host}:{server.port}")
    nodes = Database(multi, table_prefix=db.schema.prefix)
    try:
        with caplog.at_level(logging.WARNING, logger="messaging.store.nodes"), nodes.read() as conn:
            assert conn.execute(text("SELECT @@port")).scalar() == server.port
        assert caplog.messages == []  # the first connection is no move
    finally:
        nodes.dispose()


def test_a_lost_node_moves_the_connections_on_with_one_line(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The node in use drops the connection (KILL): the retried transaction reconnects,
    to the next node in the list, and the move is logged once."""
    server = make_url(db.url)
    same = f"{server.host}:{server.port}"
    other = f"localhost:{server.port}"  # the same server under another name: a second node
    nodes = Database(db.url.replace(same, f"{same},{other}"), table_prefix=db.schema.prefix)
    try:
        with nodes.read() as conn:
            victim = conn.execute(text("SELECT CONNECTION_ID()")).scalar()
        with db.transaction() as conn:
            conn.execute(text(f"KILL {victim}"))

        def port_of_a_write() -> str:
            with nodes.transaction() as conn:
                return str(conn.execute(text("SELECT CONNECTION_ID()")).scalar())

        with caplog.at_level(logging.WARNING, logger="messaging.store.nodes"):
            retry_transient(port_of_a_write, ConflictRetrySettings(), what="probe")
            retry_transient(port_of_a_write, ConflictRetrySettings(), what="probe")
        moves = [m for m in caplog.messages if "now using" in m]
        assert moves == [m for m in moves if m.endswith(f"now using {other}")]
        assert len(moves) == 1, caplog.messages
    finally:
        nodes.dispose()
