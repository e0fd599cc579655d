"""The route consumer of ``benchmarks/duplicates.py``: an external effect per message.

``http-out`` POSTs every message it handles to the endpoint at
``$DUPLICATES_BENCHMARK_ENDPOINT`` (``127.0.0.1:PORT``, served by the benchmark process),
with the message's stable ``message-id`` as its ``Idempotency-Key`` header and this
process's pid as ``X-Instance-Pid`` (so that the benchmark can tell which instance made a
request, and so which crash a repeated one follows). The endpoint answers after a delay of
its own (the remote service's time); any answer but 200 fails the message. Idempotent, so
the framework records each handled id in the batch's transaction: its guard covers the
database, not this POST, which a batch applied again after a crash sends again.
"""

from __future__ import annotations

import http.client
import json
import os

import attrs

from messaging import HandlerContext, handler, message, route_consumer

DESTINATION = "http-out"
PARTITIONS = 16
ENDPOINT_ENV = "DUPLICATES_BENCHMARK_ENDPOINT"
PATH = "/effects"
PID_HEADER = "X-Instance-Pid"


@message("bench.duplicates.request")
@attrs.define(frozen=True)
class Request:
    n: int


@route_consumer(DESTINATION, partitions=PARTITIONS, idempotent=True)
class HttpOut:
    """One POST per message, on a connection of its own (no keep-alive: a request is never
    retried on a reused connection, which could send it twice by itself)."""

    @handler
    def post(self, request: Request, ctx: HandlerContext) -> None:
        key = ctx.envelope.message_id
        if key is None:
            raise ValueError(f"message at position {ctx.position} has no message-id")
        host, port = os.environ[ENDPOINT_ENV].rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            connection.request(
                "POST",
                PATH,
                body=json.dumps({"n": request.n}),
                headers={
                    "Content-Type": "application/json",
                    "Idempotency-Key": key,
                    PID_HEADER: str(os.getpid()),
                },
            )
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"POST {PATH} for {key}: HTTP {response.status}")
        finally:
            connection.close()
