"""A TCP proxy whose network can die without a word, as a firewall, a NAT gateway, a load
balancer or a moved virtual IP lets it die.

- :meth:`SilentProxy.freeze`: no byte passes either way and nothing is closed; new
  connections are accepted (the kernel completes the TCP handshake) but get no byte
  either, so a client waits for the server's greeting.
- :meth:`SilentProxy.thaw`: bytes pass again, on the same connections.
- :meth:`SilentProxy.forget`: every connection carried so far is forgotten: its server
  side is closed, its client side is kept open and never read nor written again (the
  client never hears of it); connections made from then on pass normally.
- :meth:`SilentProxy.freeze_at_commit`: the next ``COMMIT`` of a transaction that sent a
  given statement reaches the server, then everything freezes: the transaction commits,
  its client never hears so.

Bytes a frozen connection receives are held and passed on at the thaw, as TCP would
retransmit them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from sqlalchemy.engine import make_url

_COMMIT = b"\x03COMMIT"
_ROLLBACK = b"\x03ROLLBACK"
"""COM_QUERY packets' command byte and text, as PyMySQL's ``commit()`` and ``rollback()``
send them."""


class _Link:
    """One proxied connection: the client's socket and the server's."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.forgotten = False
        self.wrote = False
        """Whether the transaction under way sent the statement a freeze waits for."""


class SilentProxy:
    """Listens on 127.0.0.1 (an ephemeral port) and forwards to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._flowing = threading.Condition()
        self._frozen = False
        self._closed = False
        self._links: list[_Link] = []
        self._kept: list[socket.socket] = []
        """Client sides of forgotten links: open until :meth:`close`, never used."""
        self._armed: tuple[bytes, int] | None = None
        self.frozen_at: float | None = None
        """When (monotonic) the proxy last froze."""
        threading.Thread(target=self._accept, name="silent-proxy", daemon=True).start()

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by this proxy's."""
        return make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(False)

    def freeze(self) -> None:
        """Stop every byte, both ways, on every connection (old and new)."""
        with self._flowing:
            self._frozen = True
            self.frozen_at = time.monotonic()

    def freeze_at_commit(self, statement: bytes, *, skip: int = 0) -> None:
        """Freeze right after passing on the ``COMMIT`` of the ``skip + 1``-th transaction
        from now that sent a statement containing ``statement``: it commits on the server,
        and its answer is held with everything else."""
        with self._flowing:
            self._armed = (statement, skip)

    def thaw(self) -> None:
        """Let bytes pass again."""
        with self._flowing:
            self._frozen = False
            self._flowing.notify_all()

    def forget(self) -> None:
        """Forget every connection so far: close its server side, keep its client side
        open and silent. Also thaws, so that new connections pass."""
        with self._flowing:
            links, self._links = self._links, []
            for link in links:
                link.forgotten = True
                self._kept.append(link.client)
                _shut(link.server)
            self._frozen = False
            self._flowing.notify_all()

    def close(self) -> None:
        """Stop listening and close every socket."""
        with self._flowing:
            self._closed = True
            self._frozen = False
            self._flowing.notify_all()
            sockets = [s for link in self._links for s in (link.client, link.server)]
            sockets += self._kept
        for sock in [self._listener, *sockets]:
            _shut(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        if not self._wait_flowing(None):
            return
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        link = _Link(client, server)
        with self._flowing:
            self._links.append(link)
        threading.Thread(target=self._pump, args=(link, client, server), daemon=True).start()
        threading.Thread(target=self._pump, args=(link, server, client), daemon=True).start()

    def _wait_flowing(self, link: _Link | None) -> bool:
        """Wait while frozen; False when the link was forgotten or the proxy closed."""
        with self._flowing:
            while self._frozen and not self._closed and not (link and link.forgotten):
                self._flowing.wait()
            return not self._closed and not (link and link.forgotten)

    def _commits_then_freezes(self, link: _Link, data: bytes) -> bool:
        """Whether ``data`` from the client is the armed COMMIT (the proxy freezes now)."""
        with self._flowing:
            if self._armed is None or self._frozen:
                return False
            statement, skip = self._armed
            link.wrote = (link.wrote or statement in data) and _ROLLBACK not in data
            if _COMMIT not in data or not link.wrote:
                return False
            link.wrote = False
            if skip:
                self._armed = (statement, skip - 1)
                return False
            self._armed = None
            self._frozen = True
            self.frozen_at = time.monotonic()
            return True

    def _pump(self, link: _Link, source: socket.socket, target: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if source is link.client and self._commits_then_freezes(link, data):
                with contextlib.suppress(OSError):
                    target.sendall(data)  # the COMMIT: only its answer is held
                continue
            if not self._wait_flowing(link):
                return  # forgotten: the client side stays open, silent
            if not data:
                break
            try:
                target.sendall(data)
            except OSError:
                break
        if not link.forgotten:  # an ordinary close passes on as one
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def _shut(sock: socket.socket) -> None:
    """Close ``sock`` for its peer too: a close alone leaves a socket that a pump thread is
    reading open (the server's session, and its locks, would linger)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
