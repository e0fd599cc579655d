"""``GET /admin/consumers/<name>/progress``: a server-sent-events stream of a consumer's
checkpoints, for pages that refresh when a read model changes.

The first event is the current state; another follows each time a checkpoint, a
partition's status or the committed head moves (checked every ``idle-poll-interval``):

    event: progress
    data: {"consumer": "...", "head": 42, "partitions": [{"partition": 0, "checkpoint": 40,
           "status": "running"}, ...]}

A comment line every :data:`KEEPALIVE` seconds keeps proxies from closing an idle stream.
The stream ends after :data:`MAX_STREAM` seconds (a browser's ``EventSource`` reconnects
by itself), when the client disconnects (checked at every poll: its thread is freed),
or when the server closes. An unknown consumer is a 404 before the stream starts. It is
a read: no admin token. Each stream holds one of the server's handler threads and polls
on its own (one statement per poll).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from messaging import ConsumerSettings, Database
from projections._admin_http import LimitedRequestHandler
from projections._admin_waits import client_gone

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Connection": "close",
}
KEEPALIVE = 15.0
MAX_STREAM = 300.0

Send = Callable[[bytes], None]


def serve(
    handler: LimitedRequestHandler, db: Database, settings: ConsumerSettings, name: str
) -> None:
    """Answer ``handler``'s request with the stream of consumer ``name`` (404 unknown)."""
    first = snapshot(db, name)
    if first is None:
        handler.send_json(404, {"error": f"unknown consumer {name!r}"})
        return
    handler.close_connection = True
    handler.send_response(200)
    for header, value in SSE_HEADERS.items():
        handler.send_header(header, value)
    handler.end_headers()
    sock = handler.connection

    def send(data: bytes) -> None:
        handler.wfile.write(data)
        handler.wfile.flush()

    with contextlib.suppress(OSError):  # the client or the server cut the connection
        stream(db, settings, first, send, lambda: client_gone(sock))


def snapshot(db: Database, consumer: str) -> dict[str, Any] | None:
    """The consumer's partitions and the committed head; None for an unknown consumer."""
    schema, tenant = db.schema, db.tenant
    p, c, positions = schema.partitions, schema.consumers, schema.positions
    with db.read() as conn:
        known = conn.execute(
            select(c.c.name).where(c.c.tenant == tenant, c.c.name == consumer)
        ).first()
        if known is None:
            return None
        head = conn.execute(
            select(positions.c.last_position).where(positions.c.tenant == tenant)
        ).scalar()
        rows = conn.execute(
            select(p.c.partition_no, p.c.checkpoint, p.c.status)
            .where(p.c.tenant == tenant, p.c.consumer == consumer)
            .order_by(p.c.partition_no)
        ).all()
    return {
        "consumer": consumer,
        "head": int(head or 0),
        "partitions": [
            {"partition": int(r[0]), "checkpoint": int(r[1]), "status": str(r[2])} for r in rows
        ],
    }


def stream(
    db: Database,
    settings: ConsumerSettings,
    first: dict[str, Any],
    send: Send,
    gone: Callable[[], bool],
    *,
    max_seconds: float = MAX_STREAM,
) -> None:
    """Send ``first`` and every change after it as events, until the client is gone, the
    stream's time is up or a write fails (the connection was cut)."""
    ends = time.monotonic() + max_seconds
    last, quiet_since = first, time.monotonic()
    send(_event(first))
    while time.monotonic() < ends:
        time.sleep(settings.idle_poll_interval)
        if gone():
            return
        now = snapshot(db, first["consumer"])
        if now is None:  # the consumer went away
            return
        if now != last:
            send(_event(now))
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= KEEPALIVE:
            send(b": keep-alive\n\n")
            quiet_since = time.monotonic()


def _event(data: dict[str, Any]) -> bytes:
    return b"event: progress\ndata: " + json.dumps(data).encode() + b"\n\n"
