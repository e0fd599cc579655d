"""Holding the admin server's connections open, as an attacker would: 200 idle
half-sent requests and a slow trickle. The server's threads stay bounded, the instance
keeps applying meanwhile, excess connections are told 503, and an honest request is
answered once the deadlines cut the idle ones."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from admin_client import get_json
from admin_target import LiveAdmin, live_admin
from clusters import lag, wait_until

TIMEOUT = 2.0
IDLE_CONNECTIONS = 200


@pytest.fixture
def target(tmp_path: Path) -> Iterator[LiveAdmin]:
    """A target whose server gives a request 2 s to arrive."""
    with live_admin(tmp_path, token=True, request_timeout=TIMEOUT) as live:
        yield live


def _admin_threads() -> int:
    return sum(t.name.startswith("admin-http") for t in threading.enumerate())


class ThreadSampler:
    """Records the most admin-server threads and threads in all seen while running."""

    def __init__(self) -> None:
        self.most_admin = 0
        self.most_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.most_admin = max(self.most_admin, _admin_threads())
            self.most_total = max(self.most_total, threading.active_count())

    def __enter__(self) -> ThreadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_idle_half_open_connections_hold_neither_threads_nor_the_instance(
    target: LiveAdmin,
) -> None:
    server = target.server
    threads_before = threading.active_count()
    half_request = f"GET /admin/consumers HTTP/1.1\r\nHost: 127.0.0.1:{target.port}\r\n".encode()
    attackers: list[socket.socket] = []
    try:
        with ThreadSampler() as sampler:
            for _ in range(IDLE_CONNECTIONS):
                sock = socket.create_connection(("127.0.0.1", target.port), timeout=10)
                sock.sendall(half_request)  # and never the blank line that ends it
                attackers.append(sock)
            started = time.monotonic()

            # The instance keeps applying what is appended while they hang on.
            target.append(2, 300)
            wait_until(lambda: lag(target.db) == 0, timeout=30, what="the instance to apply")

            # Beyond the threads and the waiting room, connections are told 503 at once.
            waiting_room = server.max_threads + server.max_waiting
            busy = _answered_busy(attackers, expected=IDLE_CONNECTIONS - waiting_room)
            assert busy >= IDLE_CONNECTIONS - waiting_room

            # An honest client is answered once the deadlines cut the idle ones, while
            # every attacker still holds its socket open.
            def answered() -> bool:
                try:
                    return get_json(f"{target.base}/admin/consumers")[0] == 200
                except OSError:  # refused with 503 (urllib raises) or reset
                    return False

            wait_until(answered, timeout=4 * TIMEOUT + 5, what="an honest request's answer")
            honest_after = time.monotonic() - started
    finally:
        for sock in attackers:
            sock.close()
    assert sampler.most_admin <= server.max_threads
    assert sampler.most_total <= threads_before + server.max_threads + 1  # + the sampler
    assert honest_after < 4 * TIMEOUT + 5
    wait_until(lambda: server.open_connections == 0, timeout=10, what="the server to let go")


def _answered_busy(sockets: list[socket.socket], *, expected: int) -> int:
    """How many of ``sockets`` received a 503, waiting up to 5 s for ``expected`` of them."""
    busy: set[socket.socket] = set()
    deadline = time.monotonic() + 5
    while len(busy) < expected and time.monotonic() < deadline:
        readable, _, _ = select.select([s for s in sockets if s not in busy], [], [], 0.2)
        for sock in readable:
            data = sock.recv(4096)
            assert data.startswith(b"HTTP/1.1 503 "), data
            busy.add(sock)
    return len(busy)


def test_a_trickled_request_is_cut_at_its_deadline(target: LiveAdmin) -> None:
    """A byte every half second never completes a request: the connection is closed when
    the request's deadline passes, not kept alive by each byte."""
    started = time.monotonic()  # before the connection: the server's deadline starts later
    with socket.create_connection(("127.0.0.1", target.port), timeout=10) as sock:
        closed = False
        for byte in b"GET /admin/consumers HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            readable, _, _ = select.select([sock], [], [], 0.5)
            if readable and sock.recv(1) == b"":
                closed = True
                break
        elapsed = time.monotonic() - started
    assert closed, "the trickle was served for 50 s"
    assert TIMEOUT <= elapsed < TIMEOUT + 1.5
