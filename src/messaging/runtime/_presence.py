"""An instance's row in the database, as its peers see it: registered at start (refusing
a name a live instance has), stamped by the heartbeat loop, updated with what the
instance runs and what its in-memory copies are doing, removed at the stop.

It also keeps how the database looks to the instance's loops (:attr:`Presence.outage`):
unreachable or refusing writes, logged once on each edge, and what the readiness probe
reports.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

import attrs
from sqlalchemy import Connection, select

from messaging._bounds import lock_wait_bound
from messaging._errors import ProjectionsError
from messaging._lifecycle import Identity, partition_event
from messaging._settings import ConsumerSettings
from messaging.applying._apply_timeout import Stuck
from messaging.applying._in_memory import InMemoryConsumer
from messaging.applying._outage import Heartbeats, Outage, run_every
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from messaging.distribution._pulse import bump_generation
from messaging.runtime._process import process_exists
from messaging.runtime._watchdog import Watchdog, round_bound
from messaging.store._database import Database
from messaging.store._retry import report_retry, retry_transient

log = logging.getLogger("messaging.runtime.instance")

T = TypeVar("T")


class Retry:
    """Runs an action under ``conflict-retry``, telling the plugins of each retry."""

    def __init__(self, settings: ConsumerSettings, who: Identity) -> None:
        self._settings, self._who = settings, who

    def __call__(self, action: Callable[[], T], what: str) -> T:
        who = self._who
        return retry_transient(
            action,
            self._settings.conflict_retry,
            what=what,
            on_retry=partial(report_retry, who.hooks, who.id, what),
        )


class Presence:
    """One instance's row: its registration, heartbeats and what it publishes."""

    def __init__(
        self,
        *,
        db: Database,
        membership: Membership,
        who: Identity,
        info: InstanceInfo,
        settings: ConsumerSettings,
        stopping: threading.Event,
        in_memory: Mapping[str, InMemoryConsumer],
        retry: Retry,
        stuck: Callable[[], list[Stuck]] = list,
    ) -> None:
        self._db, self._membership, self._who, self._settings = db, membership, who, settings
        self._stopping, self._in_memory, self._retry = stopping, in_memory, retry
        self._stuck = stuck
        self.declares: frozenset[str] = frozenset()
        """The consumers its code declares, run or not (set at the start)."""
        self._stale_since: dict[str, float] = {}
        self._stale_noticed: dict[str, float] = {}  # the same, by time.monotonic()
        self._published_stuck: list[dict[str, Any]] = []
        """The stuck batches the row names now (published when they change)."""
        self.info = info
        """What the row says of the instance (its runs change as rounds start workers)."""
        self.registered = False
        self.admin_url: str | None = None
        """Where this instance's admin endpoints answer, if it serves them (published)."""
        stale = settings.stale_instance_timeout
        self.heartbeats = Heartbeats(info.name, stale, db.engine)
        self.outage = Outage(f"instance {info.name}", self.heartbeats)
        """The database as the workers and the rebalance loop see it: logged on its edges."""
        self.heartbeat_outage = Outage(f"instance {info.name} heartbeat", self.heartbeats)
        self._beat_soon = threading.Event()
        """Set when a database session opens: the heartbeat records it at once."""

    def hold(self, interval: float) -> None:
        """Hold the liveness signal the peers watch (``distribution._membership``), beating
        every ``interval``."""
        self._membership.hold(self.info.id, interval)

    def let_go(self) -> None:
        """Let the liveness signal go: the row says "stopping", the peers watch it no more."""
        self._membership.let_go()

    def register(self) -> None:
        """Insert this instance's row, refusing a name a live instance already has. A holder
        of the name on this host whose process is gone (a restarted worker's predecessor,
        killed with SIGKILL) is not waited for: its row is removed, live or stale."""
        info, timeout = self.info, self._settings.stale_instance_timeout
        with self._db.transaction() as conn:
            for other in self._membership.instances(conn, timeout):
                if other.id == info.id:
                    self.registered = True
                    return  # an earlier attempt committed unacknowledged: registered already
                if other.name != info.name:
                    continue
                if other.host == info.host and not process_exists(other.pid):
                    log.info(
                        "instance %s: its previous holder (pid %d) is gone; taking over",
                        info.name,
                        other.pid,
                    )
                    self._membership.deregister(conn, other.id)
                    continue
                if not other.live:
                    continue
                raise ProjectionsError(
                    f"instance name {info.name!r} is taken by a live instance "
                    f"(pid {other.pid} on {other.host}); choose another with --instance-name"
                )
            self._membership.register(conn, info)
            bump_generation(self._db, conn)
        self.registered = True

    def publish_runs(self, runs: Mapping[str, Mapping[str, Any]]) -> None:
        """Tell the peers which consumers (by name) this instance runs, and how, and which
        of those its code declares it does not run (:meth:`stale`)."""
        self.info = attrs.evolve(self.info, runs=runs)

        def update() -> None:
            with self._db.transaction() as conn:
                self._membership.update_runs(conn, self.info.id, runs)
                self._publish_in_memory(conn, self._published_stuck)

        self._retry(update, "publish what it runs")

    def forget(self, name: str) -> None:
        """Stop telling the peers that this instance runs ``name``: it applies nothing of
        it, so nobody may plan partitions of it here."""
        self.publish_runs({c: run for c, run in self.info.runs.items() if c != name})

    def stale(self, conn: Connection) -> dict[str, float]:
        """The consumers its code declares that it does not run (the database holds another
        declaration of them), each with the database time it first published so (peers
        read it: ``health``, ``projections remove``)."""
        stale = self._stale_names()
        if any(name not in self._stale_since for name in stale):
            now = float(conn.execute(select(self._db.clock.now())).scalar_one())
            for name in stale:
                self._stale_since.setdefault(name, now)
                self._stale_noticed.setdefault(name, time.monotonic())
        return {name: self._stale_since[name] for name in stale}

    def stale_for(self) -> dict[str, float]:
        """From memory (for the readiness probe): seconds since each consumer its code
        declares and does not run was first published as such."""
        now = time.monotonic()
        return {
            name: now - self._stale_noticed[name]
            for name in self._stale_names()
            if name in self._stale_noticed
        }

    def _stale_names(self) -> list[str]:
        running = {unit.partition("@")[0] for unit in self.info.runs}
        return sorted(self.declares - running)

    def heartbeat(self) -> None:
        """Stamp the row's heartbeat (and whether the instance is stopping); register again
        if the row was removed, and tell the peers if it had turned stale or been declared
        gone; now and then, remove rows of instances long dead."""
        started = time.perf_counter()
        stale = self._settings.stale_instance_timeout
        self.heartbeats.sending()
        with self._db.transaction() as conn:
            stopping = self._stopping.is_set()
            sent = time.monotonic()  # no later than the time the row records
            beat = self._membership.heartbeat(conn, self.info.id, stale, stopping=stopping)
            if beat != "live":
                log.warning("instance %s: its row was %s; live again", self.info.name, beat)
            if beat == "removed":
                self._membership.register(conn, self.info)
            stuck = [attrs.asdict(batch) for batch in self._stuck()]
            if self._in_memory or stuck != self._published_stuck:
                self._publish_in_memory(conn, stuck)
            if stopping or beat != "live":  # the others plan without (or with) this instance
                bump_generation(self._db, conn)
        self.heartbeats.beat(sent)
        self._published_stuck = stuck  # committed
        seconds = time.perf_counter() - started
        self._who.hooks.projections_heartbeat(instance_id=self._who.id, seconds=seconds)
        self._membership.remove_stale_when_due(stale)

    def silence(self) -> float | None:
        """Seconds the database has left a heartbeat unanswered, once past the lock-wait
        bound (a healthy wait for a lock gives up by then, so the server is not answering);
        None until then. From memory: a probe asks it without touching the database."""
        waited = self.heartbeats.unanswered()
        return waited if waited > lock_wait_bound(self._settings.stale_instance_timeout) else None

    def publish_in_memory(self) -> None:
        """Write what the in-memory consumers are doing to the row now (the heartbeat does
        it too), for ``status`` and the admin endpoints of every instance."""
        with self._db.transaction() as conn:
            self._publish_in_memory(conn, self._published_stuck)

    def _publish_in_memory(self, conn: Connection, stuck: list[dict[str, Any]]) -> None:
        """The row's report of the in-memory consumers and of the batches stuck past their
        apply timeout (for ``health``: a stalled partition names where its handler is)."""
        consumers = {name: copy.snapshot() for name, copy in self._in_memory.items()}
        published = {
            "admin": self.admin_url,
            "consumers": consumers,
            "stuck": stuck,
            "stale": self.stale(conn),
        }
        self._membership.publish_in_memory(conn, self.info.id, published)

    def loop(self, watchdog: Watchdog, stop: threading.Event) -> None:
        """Beat every ``heartbeat-interval`` until ``stop``, and at once when a database
        session opens (so the row names it before a peer may need to end it)."""
        interval = self._settings.heartbeat_interval
        watchdog.watch("heartbeat", round_bound(self._settings, interval, db=self._db))
        beat = partial(watchdog.beat, "heartbeat")
        if self._db.sessions is not None:
            self._db.sessions.on_open(self._beat_soon)
        run_every(
            interval,
            partial(self._retry, self.heartbeat, "heartbeat"),
            f"instance {self.info.name}: heartbeat",
            stop,
            self.heartbeat_outage,
            beat=beat,
            soon=self._beat_soon,
        )

    def wake(self) -> None:
        """Beat now (the heartbeat loop's stop event is set: it ends)."""
        self._beat_soon.set()

    def leave(self) -> None:
        """Release every partition and remove the row (retried; a retry after a commit that
        went through finds nothing left); say which partitions were let go."""
        released: dict[tuple[str, int], None] = {}
        ownership = Ownership(self._db)

        def leave() -> None:
            with self._db.transaction() as conn:
                released.update(dict.fromkeys(ownership.release_all(conn, self.info.id)))
                self._membership.deregister(conn, self.info.id)
                bump_generation(self._db, conn)

        self._retry(leave, "release and deregister")
        for consumer, partition in released:
            partition_event(self._who, consumer, partition, None)
