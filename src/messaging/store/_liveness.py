"""Liveness signals: something an instance holds for its process's lifetime that is let go
the moment the process dies, so that peers who can see it take over at once instead of
waiting out ``stale-instance-timeout``.

- SQLite (one host): an exclusive ``flock`` on a file of its own beside the database. The
  kernel releases it when the process ends, however it ends; a peer on the same host that
  can take the lock knows the holder is gone. Peers on another host (a shared volume), or
  that see the database at another path, never look: its locks need not be theirs.
- MySQL/MariaDB: a named lock (``GET_LOCK``) held by a connection of its own. The server
  frees it when the connection drops, which the kernel makes happen at once when the
  process dies on a host that lives on. A connection cut while the process lives frees it
  too: the holder waits on the connection's socket and takes the lock again within
  milliseconds, and a peer believes a lock freed only after it stayed free for
  :data:`CONFIRMATION` seconds while the peer's own lock was held throughout (after a
  server restart every lock is free until its holder is back). Named locks are local to
  one server (one Galera node), so a peer looks only at instances whose lock is on its
  own server; across servers the stale timeout stays the bound.

A lost host, a frozen process or a network partition frees nothing: the stale timeout
remains the bound there. A signal that says "gone" wrongly costs a handover that the
fence (:mod:`messaging.distribution._ownership`) keeps safe; the instance's next
heartbeat makes it live again (:meth:`messaging.distribution._membership.Membership.heartbeat`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from messaging.store._sessions import Session, Sessions

if TYPE_CHECKING:
    from messaging.store._database import Database

__all__ = ["GONE", "STALE", "LockSignal", "Signal", "gone_reason", "signal_for"]

log = logging.getLogger("messaging.store.liveness")

GONE = "process gone (lock released)"
"""Why a peer was declared gone because its liveness signal was let go."""
STALE = "heartbeat stale"
"""Why a peer counts as gone when its heartbeat is older than the stale timeout."""
CONFIRMATION = 0.5
"""Seconds a peer's named lock must stay free (and one's own held) before it counts."""
_RECONNECT_DELAY = 0.1
"""Seconds between two attempts to reach the server for the named lock."""
_VERIFY_EVERY = 5.0
"""Seconds between two checks of one's own named lock while no peer is watched."""
_CLOSE_WAIT = 2.0
"""Seconds a close waits for the liveness thread (which may be connecting) to end."""
_SWEEP_AGE = 60.0
"""Seconds after which a lock file nobody holds is removed by an instance starting."""


def gone_reason(liveness: str | None) -> str | None:
    """Why the instance whose row records ``liveness`` was declared gone (None: it was not)."""
    return json.loads(liveness).get("gone") if liveness else None


def _digest(*parts: str) -> str:
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()


class Signal:
    """No signal (an in-memory database): peers wait for the stale timeout."""

    def hold(self) -> None:
        """Take the signal (before the instance's row is written)."""

    def describe(self) -> str | None:
        """What the instance's row records so that peers can find the signal (JSON)."""
        return None

    def gone(self, described: Mapping[str, str]) -> list[str]:
        """Of the peers ``described`` (id → what their row records), those whose process
        is gone as far as this signal can see."""
        return []

    def close(self) -> None:
        """Let the signal go (after the instance's row is deleted)."""


class FileSignal(Signal):
    """An exclusive ``flock`` on a file beside the SQLite database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.host = socket.gethostname()
        self._fd: int | None = None

    def hold(self) -> None:
        self.path.parent.mkdir(exist_ok=True)
        self._sweep()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
        self._fd = fd

    def describe(self) -> str | None:
        return json.dumps({"file": str(self.path), "host": self.host})

    def gone(self, described: Mapping[str, str]) -> list[str]:
        found = []
        for peer, text in described.items():
            signal = json.loads(text)
            path = Path(signal.get("file", ""))
            # Only files of this host in this directory: a peer whose path differs (another
            # mount of a shared volume) is out of sight, not gone.
            here = signal.get("host") == self.host and path.parent == self.path.parent
            if here and _let_go(str(path)):
                found.append(peer)
        return found

    def _sweep(self) -> None:
        """Remove the files of processes that died with no peer to see it (old files only:
        an instance creates its file and locks it at once, so none of those is swept)."""
        for path in self.path.parent.glob("*.lock"):
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < time.time() - _SWEEP_AGE:
                    _let_go(str(path))

    def close(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def _let_go(path: str) -> bool:
    """Whether the file lock at ``path`` is let go (the file is removed then), or was
    removed already by a peer that found it let go."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    finally:
        os.close(fd)


class LockSignal(Signal):
    """A named lock held by a connection of its own, watched by a thread that takes it
    again as soon as the connection drops, and that checks the peers' locks on the same
    connection every ``interval`` seconds (one statement)."""

    def __init__(self, engine: Engine, name: str, interval: float) -> None:
        self.engine = engine
        """Without a pool: every connection is a new one."""
        self.sessions = Sessions(engine)
        self.name = name
        self.interval = interval
        self._proxy: Any = None  # the connection holding the lock (None: not connected)
        self._session: Session | None = None
        self._held_since: float | None = None
        self._free_since: dict[str, float] = {}  # peer's lock name → when first seen free
        self._watched: dict[str, str] = {}  # peer id → its lock name
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)

    def hold(self) -> None:
        self._connect()
        if self._held_since is None:
            raise RuntimeError(f"named lock {self.name} is held by another session")
        self._thread.start()

    def describe(self) -> str | None:
        session = self._session
        if session is None:
            return None
        return json.dumps({"lock": self.name, "server": session.server, "boot": session.boot})

    def gone(self, described: Mapping[str, str]) -> list[str]:
        watched = {}
        for peer, text in described.items():
            signal = json.loads(text)
            there = Session(str(signal.get("server")), int(signal.get("boot", 0)), 0)
            if "lock" in signal and self._session and self._session.same_server(there):
                watched[peer] = str(signal["lock"])
        now = time.monotonic()
        with self._mutex:
            if watched != self._watched:
                self._watched = watched
                os.write(self._wake_write, b"w")  # check the new set now
            held = self._held_since is not None and self._held_since <= now - CONFIRMATION
            free = {n for n, since in self._free_since.items() if since <= now - CONFIRMATION}
        return sorted(peer for peer, lock in watched.items() if held and lock in free)

    def close(self) -> None:
        self._stop.set()
        os.write(self._wake_write, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=_CLOSE_WAIT)
        if self._thread.is_alive():
            return  # still connecting: it lets the lock go once done (a daemon thread)
        self._drop()
        self.engine.dispose()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _connect(self) -> None:
        proxy = self.engine.raw_connection()
        self._proxy = proxy
        self._session = self.sessions.of(proxy.dbapi_connection)
        self._query("SET SESSION wait_timeout = 31536000")
        (took,) = self._query("SELECT GET_LOCK(%s, 0)", self.name)
        with self._mutex:
            self._held_since = time.monotonic() if took == 1 else None

    def _query(self, sql: str, *args: str) -> tuple[Any, ...]:
        """The first row of ``sql`` on the lock's connection (empty for no row)."""
        cursor = self._proxy.dbapi_connection.cursor()
        try:
            cursor.execute(sql, args)
            return tuple(cursor.fetchone() or ())
        finally:
            cursor.close()

    def _drop(self) -> None:
        with self._mutex:
            self._held_since = None
            self._free_since.clear()
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            with contextlib.suppress(Exception):
                proxy.close()

    def _check(self) -> None:
        """Take the lock if not held; see whether it still is, and which peers' are free."""
        with self._mutex:
            locks = sorted(set(self._watched.values()))
            held = self._held_since is not None
        if not held:
            held = self._query("SELECT GET_LOCK(%s, 0)", self.name) == (1,)
        frees = "".join(", IS_FREE_LOCK(%s)" for _ in locks)
        mine, *free = self._query(
            f"SELECT IS_USED_LOCK(%s) = CONNECTION_ID(){frees}", self.name, *locks
        )
        now = time.monotonic()
        with self._mutex:
            if mine != 1 or not held:
                self._held_since = None
            elif self._held_since is None:
                self._held_since = now
            seen = {lock for lock, f in zip(locks, free, strict=True) if f == 1}
            self._free_since = {n: self._free_since.get(n, now) for n in seen}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._proxy is None:
                    self._connect()
                self._check()
            except Exception as exc:
                log.debug("liveness lock %s: %s; connecting again", self.name, exc)
                self._drop()
                self._stop.wait(_RECONNECT_DELAY)
                continue
            self._wait()
        self._drop()

    def _wait(self) -> None:
        """Until the next check is due, the connection drops or :meth:`close` is called."""
        with self._mutex:
            seconds = self.interval if self._watched or self._held_since is None else _VERIFY_EVERY
        sock = getattr(self._proxy.dbapi_connection, "_sock", None)
        readable, _, _ = select.select(
            [self._wake_read, *([sock] if sock is not None else [])], [], [], seconds
        )
        if self._wake_read in readable:
            os.read(self._wake_read, 4096)
        if sock is not None and sock in readable:  # the server closed it (or said goodbye)
            self._drop()


def signal_for(db: Database, instance_id: str, interval: float) -> Signal:
    """The liveness signal of instance ``instance_id`` on ``db``; a MySQL instance checks
    its peers' signals every ``interval`` seconds."""
    key = _digest(db.schema.prefix, db.tenant, instance_id)
    if db.sessions is not None:
        return LockSignal(db.unpooled_engine(), f"live-{key}", interval)
    database = make_url(db.url).database
    if not database or database == ":memory:" or "mode=memory" in db.url:
        return Signal()
    return FileSignal(Path(os.path.realpath(database) + ".live") / f"{key}.lock")
