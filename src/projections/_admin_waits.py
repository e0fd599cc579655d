"""``GET /admin/consumers/<name>/wait?token=...&timeout=...``: read your own writes over HTTP.

A long poll: the answer comes once consumer ``name`` has applied the token, or after
``timeout`` seconds (default :data:`DEFAULT_TIMEOUT`, at most :data:`MAX_TIMEOUT`; 0
checks once). It is a read: no admin token is needed.

- 200 ``{"applied": true, "consumer"}``;
- 408 ``{"error", "behind": [...]}``: not applied within the timeout, each partition behind
  with its checkpoint, lag, owner and state;
- 409 ``{"error"}``: it cannot become applied (a halted partition, a paused consumer, a
  rolled-back position);
- 404 an unknown consumer; 400 a malformed, truncated, altered or foreign token, or a bad
  timeout (the error names what is wrong).

A client that disconnects ends its wait at the next check: the handler thread is free again.
"""

from __future__ import annotations

import select
import socket
from typing import Any
from urllib.parse import parse_qs

from messaging import ConsumerSettings, Database, UnknownConsumer, WaitRefused, WaitTimeout
from messaging.operations import Waiter, parse_duration

DEFAULT_TIMEOUT = 10.0
MAX_TIMEOUT = 60.0
"""The longest a request may wait, in seconds (each wait holds a handler thread)."""

Answer = tuple[int, dict[str, Any]]


def wait_answer(
    db: Database, settings: ConsumerSettings, consumer: str, target: str, sock: socket.socket
) -> Answer | None:
    """The answer to a wait request for ``consumer`` (``target``: the request's path and
    query); None when the client on ``sock`` went away before it."""
    query = target.split("?", 1)[1] if "?" in target else ""
    try:
        params = parse_qs(query, keep_blank_values=True, max_num_fields=8)
    except ValueError as exc:
        return 400, {"error": f"bad request: {exc}"}
    unknown = sorted(set(params) - {"token", "timeout"})
    if unknown:
        return 400, {"error": f"bad request: unknown parameter(s) {', '.join(unknown)}"}
    tokens, timeouts = params.get("token", []), params.get("timeout", [str(DEFAULT_TIMEOUT)])
    if len(tokens) != 1 or len(timeouts) != 1:
        return 400, {"error": "bad request: give token once (and timeout at most once)"}
    try:
        timeout = float(timeouts[0])  # NaN and negatives are refused below, by their range
    except ValueError:
        try:
            timeout = parse_duration(timeouts[0])  # 500ms, 10s: as the CLI and YAML take
        except ValueError:
            return 400, {
                "error": "bad request: timeout must be seconds (2.5) or a duration (500ms), "
                f"got {timeouts[0]!r}"
            }
    if not 0 <= timeout <= MAX_TIMEOUT:  # NaN fails too
        return 400, {"error": f"bad request: timeout must be from 0 to {MAX_TIMEOUT:g} seconds"}
    try:
        waiter = Waiter(tokens[0], consumer, timeout, False, settings.idle_poll_interval)
        progress = waiter.watched(db, cancelled=lambda: client_gone(sock))
    except UnknownConsumer as exc:
        return 404, {"error": str(exc)}
    except WaitRefused as exc:
        return 409, {"error": str(exc)}
    except WaitTimeout as exc:
        behind = [b.as_dict() if hasattr(b, "as_dict") else str(b) for b in exc.behind]
        return 408, {"error": str(exc), "behind": behind}
    except ValueError as exc:  # InvalidToken and the like
        return 400, {"error": f"bad request: {exc}"}
    if progress is None:
        return None
    return 200, {"applied": True, "consumer": consumer}


def client_gone(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` closed its side (a pipelined request is no sign)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True
