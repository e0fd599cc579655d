"""PyMySQL builds no TLS context for a server known to offer no TLS (messaging.store._tls)."""

from __future__ import annotations

from typing import Any

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


def _params_after(offered: bool | None, **given: Any) -> dict[str, Any]:
    skip = SkipTlsWhereNone()
    skip.offered = offered
    params = dict(given)
    skip.before_connect(None, None, (), params)
    return params


def test_tls_options_of_the_url_and_a_server_offering_tls_are_left_alone() -> None:
    assert _params_after(False, host="h") == {"host": "h", "ssl_disabled": True}
    assert _params_after(None, host="h") == {"host": "h"}  # nothing known yet
    assert _params_after(True, host="h") == {"host": "h"}  # TLS offered: PyMySQL's way
    assert _params_after(False, ssl_ca="/ca.pem") == {"ssl_ca": "/ca.pem"}
    assert _params_after(False, ssl_disabled=False) == {"ssl_disabled": False}


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
