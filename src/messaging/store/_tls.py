"""PyMySQL's TLS set-up skipped for a server that offers no TLS.

Given no TLS options, PyMySQL (2.x) prefers TLS: every connection first builds a
default SSL context (loading the system's CA certificates: about 17 ms of CPU) and only
then learns whether the server offers TLS at all. An engine of one server here
remembers that its server offered none and connects without building one. Every
connection says again what the server offers: once it offers TLS, it is used again, as
PyMySQL would; a connection the server refused without TLS (a server that now requires
it) is tried again at once the usual way. One that got no answer at all (refused or
unreachable, or no answer within the answer bound) is not: the usual way would wait as
long again. A URL with TLS options of its own (``ssl_ca=...``,
``ssl_disabled=...``) is left alone; so is a driver that does not say what the server
offers, and a failover list of servers (which may differ).
"""

from __future__ import annotations

from typing import Any

from pymysql.constants import CLIENT
from sqlalchemy import Engine, event

_CLIENT_ERRORS = 2000
"""MySQL error codes from here up are the client's own (refused, unreachable, lost or
unanswered connections), below are the server's."""


class SkipTlsWhereNone:
    """Learns from each new connection whether the server offers TLS."""

    def __init__(self) -> None:
        self.offered: bool | None = None
        """Whether the server offered TLS to the last connection (None: not known)."""

    def install(self, engine: Engine) -> None:
        event.listen(engine, "do_connect", self.connect)
        event.listen(engine, "connect", self.connected)

    def connect(self, dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        """A connection without TLS set-up while the server is known to offer none; None
        (SQLAlchemy connects as usual) otherwise, or if the server refused that connection.
        A connection the server did not answer fails as it is."""
        if self.offered is not False or any(key.startswith("ssl") for key in cparams):
            return None
        try:
            return dialect.connect(*cargs, **cparams, ssl_disabled=True)
        except dialect.loaded_dbapi.Error as exc:
            code = next(iter(exc.args), None)
            if isinstance(code, int) and code >= _CLIENT_ERRORS:
                raise
            self.offered = None
            return None

    def connected(self, dbapi_connection: Any, _record: Any) -> None:
        """Note what the server offered this connection."""
        capabilities = getattr(dbapi_connection, "server_capabilities", None)
        if isinstance(capabilities, int):
            self.offered = bool(capabilities & CLIENT.SSL)
