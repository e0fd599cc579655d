"""A TCP proxy between the framework and MariaDB that loses COMMIT acknowledgements.

It understands just enough of the MySQL wire protocol (packets of a 3-byte little-endian
length and a sequence id; a command is a client packet with sequence id 0, ``COM_QUERY``
is command byte 0x03 followed by the statement's text) to recognise a ``COMMIT`` — which
is what PyMySQL's ``commit()`` sends. The handshake and authentication pass through
untouched (no TLS: PyMySQL asks for it only when given ``ssl`` options).

When a ``COMMIT`` is to lose its acknowledgement, the proxy forwards it to the server,
waits for the server's answer (the commit has happened), and closes the client's
connection without passing that answer on: the client sees a lost connection (2013)
and cannot know whether its transaction committed. With :attr:`AckProxy.silent` the
connection is kept open instead and the answer never comes: the client gives up after
its answer bound, with the same error. That happens on demand
(:meth:`AckProxy.arm`: the next N commits, optionally only of transactions whose
statements match a predicate) and at random (:attr:`AckProxy.probability`).

SQLite cannot lose an acknowledgement this way: it has no connection to lose, a commit
returns in-process, so these faults exist on MySQL/MariaDB only.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections.abc import Callable, Sequence

from sqlalchemy.engine import make_url

COM_QUERY = 0x03
TransactionFilter = Callable[[Sequence[str]], bool]
"""Decides from a transaction's statements (in order) whether its COMMIT loses its ack."""


def _read_exact(sock: socket.socket, count: int) -> bytes | None:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _read_packet(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """(header, payload) of the next packet, or None when the peer closed."""
    header = _read_exact(sock, 4)
    if header is None:
        return None
    payload = _read_exact(sock, int.from_bytes(header[:3], "little"))
    if payload is None:
        return None
    return header, payload


class AckProxy:
    """Listens on 127.0.0.1 (an ephemeral port) and forwards to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int], *, seed: int = 0) -> None:
        self.upstream = upstream
        self.probability = 0.0
        """Chance that any COMMIT loses its acknowledgement."""
        self.commits = 0
        """COMMITs forwarded so far."""
        self.dropped = 0
        """Acknowledgements lost so far."""
        self.silent = False
        """Lose acknowledgements without a word: the client's connection is kept open and
        silent (as a forgotten NAT entry leaves it) instead of cut."""
        self.on_drop: Callable[[], object] | None = None
        """Called after a lost acknowledgement's commit, before the client's connection is
        cut: whatever it does happens before the client can retry."""
        self._random = random.Random(seed)
        self._armed = 0
        self._filter: TransactionFilter | None = None
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="ack-proxy", daemon=True).start()

    def url(self, url: str) -> str:
        """``url`` (a MySQL URL of the upstream server) pointing at this proxy instead."""
        return make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(False)

    def arm(self, count: int = 1, *, when: TransactionFilter | None = None) -> None:
        """Lose the acknowledgements of the next ``count`` COMMITs (of transactions that
        ``when`` accepts, if given)."""
        with self._lock:
            self._armed = count
            self._filter = when

    @property
    def armed(self) -> int:
        """How many armed acknowledgements are still to be lost."""
        with self._lock:
            return self._armed

    def close(self) -> None:
        """Stop listening and cut every connection."""
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            self._shut(sock)

    # -- forwarding ------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                self._shut(client)
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets.update((client, server))
            swallow = threading.Event()
            threading.Thread(
                target=self._client_to_server, args=(client, server, swallow), daemon=True
            ).start()
            threading.Thread(
                target=self._server_to_client, args=(client, server, swallow), daemon=True
            ).start()

    def _should_drop(self, statements: Sequence[str]) -> bool:
        with self._lock:
            self.commits += 1
            if self._armed and (self._filter is None or self._filter(statements)):
                self._armed -= 1
                return True
            return self._random.random() < self.probability

    def _client_to_server(
        self, client: socket.socket, server: socket.socket, swallow: threading.Event
    ) -> None:
        transaction: list[str] = []
        try:
            while (packet := _read_packet(client)) is not None:
                header, payload = packet
                if header[3] == 0 and payload[:1] == bytes([COM_QUERY]):
                    text = payload[1:].decode("utf-8", "replace").strip()
                    word = text.upper()
                    if word == "COMMIT":
                        if self._should_drop(transaction):
                            swallow.set()  # before the server can answer
                        transaction = []
                    elif word in ("ROLLBACK", "BEGIN"):
                        transaction = []
                    else:
                        transaction.append(text)
                server.sendall(header + payload)
        except OSError:
            pass
        finally:
            self._shut(client)
            self._shut(server)

    def _server_to_client(
        self, client: socket.socket, server: socket.socket, swallow: threading.Event
    ) -> None:
        try:
            while (packet := _read_packet(server)) is not None:
                if swallow.is_set():
                    # The server's answer to the COMMIT: it has committed. Keep the answer.
                    with self._lock:
                        self.dropped += 1
                    if self.on_drop is not None:
                        self.on_drop()
                    if self.silent:
                        return  # the client waits; its giving up closes both sides
                    break
                client.sendall(packet[0] + packet[1])
        except OSError:
            pass
        self._shut(client)
        self._shut(server)

    def _shut(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        with self._lock:
            self._sockets.discard(sock)
