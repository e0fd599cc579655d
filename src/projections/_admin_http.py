"""An HTTP server a hostile client cannot exhaust: a bounded pool of handler threads, a
deadline for each request to arrive, and a limit on the size of a request's head.

- At most ``max_threads`` connections are served at once; up to ``max_waiting`` more
  wait for a thread; beyond that a connection is answered 503 and closed at once.
- Long requests (a long poll, an event stream: :meth:`LimitedRequestHandler.long_request`)
  take at most half of the threads; beyond that they are answered 503 with
  ``Retry-After``, so health probes and other short requests always find a thread.
- Each request (request line, headers and body) must arrive within ``request_timeout``
  seconds: of the connection's acceptance for its first request (time spent waiting for a
  thread counts), of the previous answer for the next ones. Otherwise it is closed.
- A request's headers may take at most :data:`MAX_HEAD_BYTES` bytes (431 beyond).

Error answers are JSON ``{"error": "..."}`` and close the connection.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, cast

__all__ = ["MAX_HEAD_BYTES", "BoundedHTTPServer", "LimitedRequestHandler"]

log = logging.getLogger("projections.admin_http")

#: Most bytes of header lines a request may send.
MAX_HEAD_BYTES = 16 * 1024

#: How long and how much a closing connection's unread input is read and dropped.
_LINGER_SECONDS = 1.0
_LINGER_BYTES = 1024 * 1024
_LINGER_GAP = 0.2  # a client that sends nothing for this long has nothing more to send

_BUSY = json.dumps({"error": "the server is busy; try again"}).encode()
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(_BUSY)).encode() + b"\r\nConnection: close\r\n\r\n" + _BUSY
)


class _DeadlineSocket(io.RawIOBase):
    """A socket's incoming bytes; every read fails with :class:`TimeoutError` once the
    current deadline (a :func:`time.monotonic` value) has passed."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self.deadline = math.inf

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _RequestReader:
    """The handler's ``rfile``: buffered reads under a deadline, and ``readline`` that
    counts a request's header bytes against :data:`MAX_HEAD_BYTES` once the head began."""

    def __init__(self, sock: socket.socket) -> None:
        self._raw = _DeadlineSocket(sock)
        self._buffered = io.BufferedReader(self._raw)
        self._head_left = math.inf

    def begin_request(self, deadline: float) -> None:
        """A new request must arrive whole before ``deadline``; its head is not yet counted."""
        self._raw.deadline = deadline
        self._head_left = math.inf

    def begin_head(self) -> None:
        """Count the header lines from here on."""
        self._head_left = MAX_HEAD_BYTES

    def readline(self, limit: int = -1) -> bytes:
        if math.isfinite(self._head_left):
            cap = int(self._head_left) + 1
            limit = cap if limit < 0 else min(limit, cap)
        line = self._buffered.readline(limit)
        self._head_left -= len(line)
        if self._head_left < 0:
            raise http.client.LineTooLong(f"request headers longer than {MAX_HEAD_BYTES} bytes")
        return line

    def read(self, size: int = -1) -> bytes:
        return self._buffered.read(size)

    def close(self) -> None:
        self._buffered.close()


class BoundedHTTPServer(HTTPServer):
    """An :class:`HTTPServer` that serves connections on a bounded thread pool (see the
    module's docstring). Its handler must be a :class:`LimitedRequestHandler`."""

    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[LimitedRequestHandler],
        *,
        max_threads: int = 16,
        max_waiting: int = 64,
        request_timeout: float = 10.0,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.request_timeout = request_timeout
        self.max_threads = max_threads
        self.max_waiting = max_waiting
        self._slots = threading.BoundedSemaphore(max_threads + max_waiting)
        self.max_long = max(1, max_threads // 2)
        self.long_slots = threading.BoundedSemaphore(self.max_long)
        """Taken by each long request while it runs (see the module)."""
        self._accepted: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        # Before binding: a port in use makes the base class call server_close(), which
        # shuts the pool down (its threads start lazily, so none is left behind).
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="admin-http")
        super().__init__(address, handler)

    @property
    def open_connections(self) -> int:
        """Connections accepted and not yet closed (served or waiting for a thread)."""
        with self._lock:
            return len(self._accepted)

    def accepted_at(self, request: socket.socket) -> float:
        """When ``request`` was accepted (:func:`time.monotonic`)."""
        with self._lock:
            return self._accepted.get(request, time.monotonic())

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        with self._lock:
            self._accepted[request] = time.monotonic()
        try:
            self._pool.submit(self._serve, request, client_address)
        except RuntimeError:  # the pool was shut down: the server is closing
            self._done(request)

    def _serve(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: socket.socket) -> None:
        with self._lock:
            self._accepted.pop(request, None)
        self.shutdown_request(request)
        self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        with contextlib.suppress(OSError):
            request.setblocking(False)
            request.send(_BUSY_RESPONSE)
        super().shutdown_request(request)

    def shutdown_request(self, request: Any) -> None:
        """Close after reading what the client still sends, for a short while: closing
        with unread input would reset the connection and lose the answer just sent."""
        with contextlib.suppress(OSError):
            request.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + _LINGER_SECONDS
            drained = 0
            while drained < _LINGER_BYTES and (left := deadline - time.monotonic()) > 0:
                request.settimeout(min(left, _LINGER_GAP))
                chunk = request.recv(65536)
                if not chunk:
                    break
                drained += len(chunk)
        self.close_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("admin: error serving %s", client_address, exc_info=True)

    def server_close(self) -> None:
        """Stop listening and cut every open connection, so the handler threads end."""
        super().server_close()
        with self._lock:
            connections = list(self._accepted)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._pool.shutdown(wait=False)


class LimitedRequestHandler(BaseHTTPRequestHandler):
    """A request handler under the limits of a :class:`BoundedHTTPServer`; errors as JSON."""

    protocol_version = "HTTP/1.1"
    rfile: Any

    @property
    def bounded_server(self) -> BoundedHTTPServer:
        """The server, typed."""
        return cast(BoundedHTTPServer, self.server)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self.rfile = _RequestReader(self.connection)
        self._next_deadline = (
            self.bounded_server.accepted_at(self.connection) + self.bounded_server.request_timeout
        )

    def handle_one_request(self) -> None:
        self.rfile.begin_request(self._next_deadline)
        super().handle_one_request()
        self._next_deadline = time.monotonic() + self.bounded_server.request_timeout

    def parse_request(self) -> bool:
        self.rfile.begin_head()
        return super().parse_request()

    def end_headers(self) -> None:
        self.connection.settimeout(self.bounded_server.request_timeout)  # for a slow reader
        super().end_headers()

    @contextlib.contextmanager
    def long_request(self, what: str) -> Iterator[bool]:
        """Hold one of the server's slots for long requests (``what``: a wait, a stream)
        while the block runs; yield False, having answered 503 with ``Retry-After``, when
        all are taken."""
        slots = self.bounded_server.long_slots
        if not slots.acquire(blocking=False):
            limit = self.bounded_server.max_long
            error = f"too many {what} open at once ({limit}); try again shortly"
            self.send_json(503, {"error": error}, headers={"Retry-After": "1"})
            yield False
            return
        try:
            yield True
        finally:
            slots.release()

    def send_json(self, status: int, data: Any, *, headers: dict[str, str] | None = None) -> None:
        """Answer ``data`` as JSON; an error status (400 and above) closes the connection."""
        body = json.dumps(data, default=str).encode()
        self.send_body(status, body, "application/json", headers=headers)

    def send_body(
        self, status: int, body: bytes, content_type: str, *, headers: dict[str, str] | None = None
    ) -> None:
        """Answer ``body``; an error status (400 and above) closes the connection."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if status >= 400:
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        status = HTTPStatus(code)
        self.send_json(code, {"error": message or status.phrase})

    def read_body(self, limit: int) -> bytes | None:
        """The request's body, or None after answering 411/413/400 when it has no usable
        length, is longer than ``limit`` bytes, or ends early."""
        if self.headers.get("Transfer-Encoding") is not None:
            self.send_error(411, "send the body with a Content-Length, not chunked")
            return None
        text = self.headers.get("Content-Length") or "0"
        if not text.strip().isdigit():
            self.send_error(400, "bad request: Content-Length must be a number of bytes")
            return None
        length = int(text)
        if length > limit:
            self.send_error(413, f"request body longer than {limit} bytes")
            return None
        body: bytes = self.rfile.read(length)
        if len(body) != length:
            self.send_error(400, "bad request: the body ended before its Content-Length")
            return None
        return body

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("admin %s - %s", self.address_string(), format % args)
