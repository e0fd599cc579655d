"""One watcher per database in a process: the waits of :func:`~messaging.wait_for` share
its reads, so a thousand waiters cost what one does while nothing moves.

Each round reads, in one statement, the partition rows of every consumer waited on (with
its state and live version) and the tenant's committed head, and in a second its parked
sources (empty unless something failed): a retry or a skip applies held messages behind
the checkpoints and moves only these. A wait is checked in full
(:func:`~messaging.waits._progress.progress`, its own few statements) only the first
time and when what that statement returned for its consumers moved since its last
check; waits that nothing moved for cost nothing more. Rounds run every
``poll_interval`` (the smallest of the waits') while there are waits, at once when one
is added, and when a batch of any consumer commits: through the same
:class:`~messaging.store._database.Database` object in this process, or in another
process on this host (its commit sends a datagram to the watchers' sockets,
:mod:`messaging.store._wakeup`; a lost one costs a poll interval). The wait returns
within milliseconds of the commit it waits for. The thread ends after :data:`IDLE_EXIT`
seconds without waits.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import attrs
from sqlalchemy import Connection, literal, null, select, union_all

from messaging.store._database import Database
from messaging.store._retry import is_transient
from messaging.store._wakeup import Listener
from messaging.waits._progress import Progress, progress

log = logging.getLogger("messaging.runtime.watcher")

IDLE_EXIT = 5.0
"""Seconds the watcher's thread waits for a new wait before it ends."""


@attrs.define(eq=False)
class Watch:
    """One wait registered with a :class:`Watcher`."""

    token: Any
    consumers: list[str]
    poll_interval: float
    on_done: Callable[[], object] | None = None
    done: threading.Event = attrs.field(factory=threading.Event)
    result: Progress | None = None
    error: BaseException | None = None
    seen: object = None
    """What the round's statement returned for its consumers at its last full check."""
    last: Progress | None = None
    """What its last full check found."""

    def finish(self, result: Progress | None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()
        if self.on_done is not None:
            self.on_done()


class Watcher:
    """Checks every wait on one database (see the module)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.rounds = 0
        """Rounds run so far (each one statement, plus the full checks it needed)."""
        self._cond = threading.Condition()
        self._watches: set[Watch] = set()
        self._kicked = False
        self._thread: threading.Thread | None = None
        self._listener: Listener | None = None
        db.after_batch.append(self.kick)

    def add(self, watch: Watch) -> Watch:
        with self._cond:
            self._watches.add(watch)
            self._kicked = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wait-watcher", daemon=True)
                self._thread.start()
            self._cond.notify()
        return watch

    def remove(self, watch: Watch) -> None:
        with self._cond:
            self._watches.discard(watch)

    def kick(self) -> None:
        """Run a round now (a batch committed)."""
        with self._cond:
            if self._watches:
                self._kicked = True
                self._cond.notify()

    def _run(self) -> None:
        if self._listener is None:  # kept for good: the committers' listing of it holds
            self._listener = self.db.commit_wakeups.listen()
            if self._listener is not None:
                weakref.finalize(self, self._listener.close)
        stopped = threading.Event()
        if self._listener is not None:
            threading.Thread(
                target=self._listen,
                args=(self._listener, stopped),
                name="wait-wakeups",
                daemon=True,
            ).start()
        try:
            self._watch()
        finally:
            stopped.set()
            if self._listener is not None:
                self._listener.poke()

    def _listen(self, listener: Listener, stopped: threading.Event) -> None:
        """Kick a round whenever a process on this host commits a batch, until
        ``stopped`` (while no thread listens, the socket's queue fills and the committers'
        datagrams are refused, at no cost to them)."""
        while not stopped.is_set():
            if listener.wait(IDLE_EXIT) and not stopped.is_set():
                self.kick()

    def _watch(self) -> None:
        while True:
            with self._cond:
                if not self._watches:
                    self._cond.wait(IDLE_EXIT)
                    if not self._watches:
                        self._thread = None
                        return
                if not self._kicked:
                    self._cond.wait(min(w.poll_interval for w in self._watches))
                self._kicked = False
                watches = list(self._watches)
            if watches:
                self._round(watches)

    def _round(self, watches: list[Watch]) -> None:
        self.rounds += 1
        names = sorted({name for w in watches for name in w.consumers})
        try:
            with self.db.read() as conn:
                state = self._state(conn, names)
                for watch in watches:
                    self._check(conn, watch, state)
        except Exception as exc:
            if not is_transient(exc):
                log.exception("wait watcher: a round failed")
                for watch in watches:
                    if not watch.done.is_set():
                        watch.finish(None, exc)
            # transient: the next round tries again; each wait's deadline still holds

    def _state(self, conn: Connection, names: list[str]) -> dict[str, tuple[Any, ...]]:
        """Per consumer, its partition rows (with its state and live version), then its
        parked sources; under "", the committed head. One statement."""
        schema, tenant = self.db.schema, self.db.tenant
        p, c, parked = schema.partitions, schema.consumers, schema.parked
        head = schema.positions
        last = select(head.c.last_position).where(head.c.tenant == tenant).scalar_subquery()
        partitions = (
            select(
                p.c.consumer.label("consumer"),
                literal(0).label("kind"),
                p.c.partition_no.label("partition_no"),
                p.c.checkpoint.label("position"),
                p.c.status.label("detail"),
                c.c.state.label("state"),
                c.c.version.label("version"),
                last.label("head"),
            )
            .join(c, (c.c.tenant == p.c.tenant) & (c.c.name == p.c.consumer))
            .where(p.c.tenant == tenant, p.c.consumer.in_(names))
        )
        sources = select(
            parked.c.consumer,
            literal(1),
            parked.c.partition_no,
            parked.c.position,
            parked.c.source,
            parked.c.state,
            null(),
            last,
        ).where(parked.c.tenant == tenant, parked.c.consumer.in_(names))
        rows = conn.execute(
            union_all(partitions, sources).order_by("consumer", "kind", "partition_no", "detail")
        ).all()
        if not rows:  # nothing of theirs: the head alone (an append committing moves it)
            return {"": (conn.execute(select(last)).scalar(),)}
        state: dict[str, tuple[Any, ...]] = {"": (rows[0].head,)}
        for row in rows:
            state[row.consumer] = (*state.get(row.consumer, ()), tuple(row[1:7]))
        return state

    def _check(self, conn: Connection, watch: Watch, state: dict[str, tuple[Any, ...]]) -> None:
        if watch.done.is_set():
            return
        seen = (state[""], *(state.get(name) for name in watch.consumers))
        if seen == watch.seen:
            return
        watch.seen = seen
        try:
            found = progress(self.db, conn, watch.token, watch.consumers)
        except Exception as exc:
            if is_transient(exc):
                watch.seen = None  # checked again next round
                raise
            watch.finish(None, exc)
            return
        watch.last = found
        if found.applied:
            watch.finish(found)


_WATCHERS: weakref.WeakKeyDictionary[Database, Watcher] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def watcher_for(db: Database) -> Watcher:
    """The process's watcher of ``db`` (made on first use)."""
    with _LOCK:
        watcher = _WATCHERS.get(db)
        if watcher is None:
            watcher = _WATCHERS[db] = Watcher(db)
        return watcher


def wait_watched(
    db: Database, watch: Watch, deadline: float, cancelled: Callable[[], bool] | None = None
) -> bool:
    """Wait for ``watch`` to finish until ``deadline`` (monotonic); False if it did not
    (timed out, or ``cancelled()`` became true: asked every 50 ms)."""
    watcher = watcher_for(db)
    watcher.add(watch)
    try:
        while not watch.done.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or (cancelled is not None and cancelled()):
                return False
            watch.done.wait(min(left, 0.05) if cancelled is not None else left)
        return True
    finally:
        watcher.remove(watch)
