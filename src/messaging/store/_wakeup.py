"""Wake-ups between the processes of one host that share a database.

After a transaction that appended messages commits, the appender sends a datagram
naming the topics it appended to to every instance of the same database, tenant and
table prefix on this host (a Unix datagram socket each, in a directory of the user's own
under the temporary directory); an instance woken about a topic it reads reads its
pulse at once instead of at its next beat (one about other topics only is ignored). An
empty datagram stands for any topic (too many names to send, a name holding a line
break, or a stop), and so does a full queue (a wake-up may have been refused). It is
only a hint: a lost datagram, another host, or a platform without Unix sockets costs at
most one ``idle-poll-interval``, which the pulse would have waited anyway.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import select
import socket
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("messaging.store.wakeup")

APPENDED = "messaging_appended"
"""Key in a connection's ``info``: the set of topics appended to in its transaction, whose
readers are woken once it commits."""

ANY_TOPIC = ""
"""In the topics a wake-up names: any topic (no topic is named by the empty string)."""

_MAX_PAYLOAD = 4096
"""Bytes of topic names a datagram carries at most; more are sent as any topic."""


def _queue_length() -> int:
    """How many datagrams a socket's queue holds before a send is refused (Linux says;
    elsewhere a guess on the low side: a full queue is then only assumed too often)."""
    try:
        return int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    except (OSError, ValueError):
        return 8


_QUEUE_LENGTH = _queue_length()

_LISTING_TTL = 1.0
"""Seconds a listing of the listeners is reused by an appender."""


class Listener:
    """This instance's socket: waits for wake-ups."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.setblocking(False)
        self.socket.bind(str(path))

    def wait(self, timeout: float) -> frozenset[str]:
        """Wait up to ``timeout`` seconds; the topics the wake-ups name (:data:`ANY_TOPIC`
        for any), none if not woken (every pending wake-up is taken)."""
        readable, _, _ = select.select([self.socket], [], [], max(0.0, timeout))
        if not readable:
            return frozenset()
        topics: set[str] = set()
        taken = 0
        with contextlib.suppress(OSError):  # BlockingIOError once every one is taken
            while True:
                payload = self.socket.recv(_MAX_PAYLOAD + 1)
                topics.update(payload.decode("utf-8", "replace").split("\n"))
                taken += 1
        if taken >= _QUEUE_LENGTH:  # the queue was full: a wake-up may have been refused
            topics.add(ANY_TOPIC)
        return frozenset(topics)

    def poke(self) -> None:
        """Wake :meth:`wait` from this process (at stop)."""
        with contextlib.suppress(OSError):
            self.socket.sendto(b"", str(self.path))

    def close(self) -> None:
        self.socket.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


class WakeUps:
    """The wake-up directory of one database, tenant and table prefix on this host."""

    def __init__(self, identity: str) -> None:
        digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
        uid = os.getuid() if hasattr(os, "getuid") else 0
        self.directory = Path(tempfile.gettempdir()) / f"messaging-wake-{uid}" / digest
        self._listing: list[str] = []
        self._listed_at = float("-inf")

    def listen(self) -> Listener | None:
        """A socket of this instance's own in the directory; None where that cannot be."""
        if not hasattr(socket, "AF_UNIX"):
            return None
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            return Listener(self.directory / f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
        except OSError as exc:
            log.debug("no same-host wake-ups (%s): the pulse alone decides", exc)
            return None

    def notify(self, topics: Iterable[str] = ()) -> None:
        """Wake every listener here about ``topics`` (none: any topic); best effort, never
        raises, never blocks."""
        now = time.monotonic()
        if now - self._listed_at > _LISTING_TTL:
            try:
                self._listing = [str(p) for p in self.directory.iterdir()]
            except OSError:
                self._listing = []
            self._listed_at = now
        if not self._listing:
            return
        names = sorted(topics)
        payload = "\n".join(names).encode()
        if len(payload) > _MAX_PAYLOAD or any("\n" in name for name in names):
            payload = ANY_TOPIC.encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.setblocking(False)
            for path in self._listing:
                try:
                    sender.sendto(payload, path)
                except (ConnectionRefusedError, FileNotFoundError):
                    with contextlib.suppress(OSError):
                        os.unlink(path)  # left behind by a process that died
                    self._listed_at = float("-inf")
                except OSError:
                    pass  # a full queue: the listener takes a full queue for any topic
