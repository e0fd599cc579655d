"""A TCP proxy whose network can die without a word, as a firewall, a NAT gateway, a load
balancer or a moved virtual IP lets it die.

- :meth:`SilentProxy.freeze`: no byte passes either way and nothing is closed; new
  connections are accepted (the kernel completes the TCP handshake) but get no byte
  either, so a client waits for the server's greeting.
- :meth:`SilentProxy.thaw`: bytes pass again, on the same connections.
- :meth:`SilentProxy.forget`: every connection carried so far is forgotten: its server
  side is closed, its client side is kept open and never read nor written again (the
  client never hears of it); connections made from then on pass normally.
- :meth:`SilentProxy.drop`: the same, but the server side is kept open and silent too, as
  a NAT gateway that forgot a connection leaves it: the server's session, and any
  transaction it holds open with its locks, lives on until somebody ends it.

Bytes a frozen connection receives are held and passed on at the thaw, as TCP would
retransmit them.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from sqlalchemy.engine import make_url


class _Link:
    """One proxied connection: the client's socket and the server's."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.forgotten = False


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
        threading.Thread(target=self._accept, name="silent-proxy", daemon=True).start()

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by this proxy's."""
        return make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(False)

    @property
    def frozen(self) -> bool:
        return self._frozen

    def freeze(self) -> None:
        """Stop every byte, both ways, on every connection (old and new)."""
        with self._flowing:
            self._frozen = True

    def thaw(self) -> None:
        """Let bytes pass again."""
        with self._flowing:
            self._frozen = False
            self._flowing.notify_all()

    def forget(self) -> None:
        """Forget every connection so far: close its server side, keep its client side
        open and silent. Also thaws, so that new connections pass."""
        self._abandon(close_server=True)

    def drop(self) -> None:
        """Forget every connection so far, keeping both of its sides open and silent. Also
        thaws, so that new connections pass."""
        self._abandon(close_server=False)

    def _abandon(self, *, close_server: bool) -> None:
        with self._flowing:
            links, self._links = self._links, []
            for link in links:
                link.forgotten = True
                self._kept.append(link.client)
                if close_server:  # shut down first: a pump blocked on it keeps it open
                    with contextlib.suppress(OSError):
                        link.server.shutdown(socket.SHUT_RDWR)
                    link.server.close()
                else:
                    self._kept.append(link.server)
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
            with contextlib.suppress(OSError):  # shut down first: a blocked recv keeps it open
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

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

    def _pump(self, link: _Link, source: socket.socket, target: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
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
