"""PyMySQL's TLS set-up skipped for a server that offers no TLS.

Given no TLS options, PyMySQL prefers TLS: every connection first builds a default SSL
context (loading the system's CA certificates: about 17 ms of CPU) and only then learns
whether the server offers TLS at all. An engine here remembers that its server offered
none and connects without building one, until a server offers TLS again (which is then
used, as PyMySQL would). A URL with TLS options of its own (``ssl_ca=...``,
``ssl_disabled=...``) is left alone; so is a driver that does not say what the server
offers.
"""

from __future__ import annotations

from typing import Any

from pymysql.constants import CLIENT
from sqlalchemy import Engine, event


class SkipTlsWhereNone:
    """Learns from each new connection whether the server offers TLS."""

    def __init__(self) -> None:
        self.offered: bool | None = None
        """Whether the server offered TLS to the last connection (None: not known)."""

    def install(self, engine: Engine) -> None:
        """Listen on ``engine``; before any other ``do_connect`` listener (a failover's)."""
        event.listen(engine, "do_connect", self.before_connect)
        event.listen(engine, "connect", self.connected)

    def before_connect(
        self, _dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]
    ) -> None:
        """Connect without TLS set-up while the server is known to offer none."""
        if self.offered is False and not any(key.startswith("ssl") for key in cparams):
            cparams["ssl_disabled"] = True

    def connected(self, dbapi_connection: Any, _record: Any) -> None:
        """Note what the server offered this connection."""
        capabilities = getattr(dbapi_connection, "server_capabilities", None)
        if isinstance(capabilities, int):
            self.offered = bool(capabilities & CLIENT.SSL)
