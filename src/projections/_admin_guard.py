"""Who may ask the admin server what: the ``Host`` check (DNS rebinding), and for commands
the bearer token, the ``Origin`` check and the JSON content type (cross-site requests).

Pure functions of the request's headers; :mod:`projections._admin` answers the refusals.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable

import attrs

from messaging import ProjectionsError
from messaging.operations import ADMIN_TOKEN_ENV

__all__ = ["AdminGuard", "Refusal", "is_loopback", "require_token_off_loopback"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
_WILDCARDS = frozenset({"0.0.0.0", "::"})

DISABLED = (
    "state-changing commands are disabled: no admin token is configured; set admin.token "
    f"in the config or ${ADMIN_TOKEN_ENV} and restart the server"
)
UNAUTHORIZED = "missing or wrong admin token: send 'Authorization: Bearer <token>'"
CROSS_ORIGIN = "cross-origin request refused: the Origin header does not name this server"
NOT_JSON = "commands need 'Content-Type: application/json'"
WRONG_HOST = "misdirected request: the Host header does not name this server"


@attrs.frozen
class Refusal:
    """Why a request is refused: the HTTP status and a one-line error."""

    status: int
    error: str


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address or ``localhost``) only reaches this host."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def require_token_off_loopback(address: str, token: str | None) -> None:
    """Raise :class:`ProjectionsError` when an admin server would listen on ``address``,
    reachable from other hosts, without a token."""
    if token is None and not is_loopback(address):
        raise ProjectionsError(
            f"refusing to serve the admin endpoints on {address}, which other hosts can reach, "
            f"without an admin token: set admin.token or ${ADMIN_TOKEN_ENV}, or listen on "
            "127.0.0.1"
        )


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``name[:port]`` or ``[v6][:port]`` as (lower-case name, port or None); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
    else:
        name, _, port_text = value.partition(":")
        rest = ":" + port_text if port_text or value.endswith(":") else ""
    if not name:
        return None
    if not rest:
        return name, None
    port = rest[1:]
    if not rest.startswith(":") or not port.isdigit() or len(port) > 5:
        return None
    return name, int(port)


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class AdminGuard:
    """The checks of one server listening on ``bound_host:bound_port``.

    A ``Host`` header is accepted when it names an ``allowed_hosts`` entry (``name`` on any
    port, ``name:port`` on that one) or, on the bound port: the bound address; the loopback
    names when bound to loopback or every interface; any IP address when bound to every
    interface (a rebinding attack needs a DNS name, never an address).
    """

    def __init__(
        self, token: str | None, allowed_hosts: Iterable[str], bound_host: str, bound_port: int
    ) -> None:
        self._token = token.encode() if token is not None else None
        self._allowed = [_split_host(h) for h in allowed_hosts]
        self._port = bound_port
        bound = bound_host.lower()
        self._wildcard = bound in _WILDCARDS
        self._names = {f"[{bound}]" if ":" in bound else bound}
        if self._wildcard or is_loopback(bound):
            self._names |= LOOPBACK_NAMES

    @property
    def commands_enabled(self) -> bool:
        """Whether a token is configured, without which every command is refused."""
        return self._token is not None

    def check_host(self, hosts: list[str]) -> Refusal | None:
        """Refuse (421) unless exactly one ``Host`` header names this server."""
        parsed = _split_host(hosts[0]) if len(hosts) == 1 else None
        if parsed is None:
            return Refusal(421, WRONG_HOST)
        name, port = parsed
        for allowed_name, allowed_port in filter(None, self._allowed):
            if name == allowed_name and allowed_port in (None, port):
                return None
        if (port or 80) == self._port and (
            name in self._names or (self._wildcard and _is_ip_literal(name))
        ):
            return None
        return Refusal(421, WRONG_HOST)

    def check_command(
        self, *, authorization: str | None, origin: str | None, content_type: str | None, host: str
    ) -> Refusal | None:
        """Refuse a state-changing request unless the token is configured (else 403) and
        sent (else 401), any ``Origin`` is this server's (else 403) and the body is JSON
        (else 415)."""
        if self._token is None:
            return Refusal(403, DISABLED)
        scheme, _, sent = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            sent.strip().encode(), self._token
        ):
            return Refusal(401, UNAUTHORIZED)
        if origin is not None and origin.strip().lower() not in (
            f"http://{host.strip().lower()}",
            f"https://{host.strip().lower()}",
        ):
            return Refusal(403, CROSS_ORIGIN)
        media_type = (content_type or "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            return Refusal(415, NOT_JSON)
        return None
