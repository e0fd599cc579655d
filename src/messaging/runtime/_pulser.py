"""The pulse loop of one instance: one statement per ``idle-poll-interval`` for all of its
consumers (see :mod:`messaging.distribution._pulse`).

Each beat reads the tenant's generation and the heads of the topics the instance's
consumers read. A worker is woken when a head of one of its topics moved since the
previous beat; a rebalance round is asked for when the generation is not the one the
last round read, unless only releases moved it and this instance waits for no partition
of a live peer (a release concerns only the instance that waits for it). A commit that
appended on this host wakes the loop at once (:mod:`messaging.store._wakeup`), so it
need not wait for its next beat.

Why nothing is missed: positions commit in order, so a message committed after a
worker's poll began has a position above every head read before that poll; the first
beat after its commit sees its topic's head move (against a beat read before the commit)
and wakes the worker, whose news flag it cleared before polling. A failed beat is
compared against the last good one later, so it only delays.

Each beat also asks the instance's liveness signal (:mod:`messaging.store._liveness`)
which live peers it sees gone, declares those gone in the database and runs a rebalance
round at once: a crashed process's partitions move within a second or two, not after
``stale-instance-timeout``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from messaging._lifecycle import Identity
from messaging._settings import ConsumerSettings
from messaging.applying._in_memory import InMemoryConsumer
from messaging.applying._outage import Failing, Outage
from messaging.distribution._membership import Membership
from messaging.distribution._pulse import Pulse, PulseReader, bump_generation, only_releases
from messaging.runtime._rebalancer import Rebalancer
from messaging.runtime._units import Units
from messaging.runtime._watchdog import Watchdog, round_bound
from messaging.store._database import Database
from messaging.store._liveness import GONE
from messaging.store._wakeup import ANY_TOPIC, Listener

log = logging.getLogger("messaging.runtime.pulser")

MIN_GAP = 0.002
"""Seconds between two beats at least, however often appends wake the loop."""


class Pulser:
    """Reads one instance's pulse and acts on it."""

    def __init__(
        self,
        *,
        db: Database,
        who: Identity,
        settings: ConsumerSettings,
        membership: Membership,
        rebalancer: Rebalancer,
        units: Units,
        in_memory: Mapping[str, InMemoryConsumer],
        watchdog: Watchdog,
        outage: Outage,
    ) -> None:
        self._db, self._who, self._settings, self._membership = db, who, settings, membership
        self._rebalancer, self._units, self._in_memory = rebalancer, units, in_memory
        self._watchdog, self._outage = watchdog, outage
        self.last: Pulse | None = None
        """The last good reading."""
        self._listener: Listener | None = None
        self._reader: PulseReader | None = None
        self._declared: set[str] = set()
        """Peers declared gone here since the last round (not looked at again until then)."""
        self._declared_at: int | None = None
        """The generation the last round had read when they were declared."""
        self._failing = Failing(
            f"instance {who.name}", "reading the pulse", "rebalancing at the regular interval"
        )

    def topics(self) -> list[str]:
        """Every topic a consumer of the instance reads."""
        workers = [*self._units.workers.values(), *self._in_memory.values()]
        return sorted({topic for worker in workers for topic in worker.spec.topics})

    def beat(self) -> bool:
        """Read the pulse once and wake the workers whose topics moved; return whether the
        generation differs from the one the last rebalance round read (a round is due)."""
        topics = self.topics()
        if self._reader is None or self._reader.topics != topics:
            self._reader = PulseReader(self._db, topics)
        with self._db.read() as conn:
            pulse = self._reader.read(conn)
        moved = pulse.moved(self.last)
        self.last = pulse
        if moved:
            for worker in [*self._units.workers.values(), *self._in_memory.values()]:
                if moved.intersection(worker.spec.topics):
                    worker.wake()
        rebalancer = self._rebalancer
        moved_on = pulse.generation != rebalancer.generation and (
            rebalancer.awaiting() or not only_releases(rebalancer.generation, pulse.generation)
        )
        return self.watch() or moved_on

    def watch(self) -> bool:
        """Declare gone the live peers whose liveness signal this instance sees let go;
        return whether it declared any (a round is due)."""
        stale = self._settings.stale_instance_timeout
        if self._declared_at != self._rebalancer.generation:
            self._declared, self._declared_at = set(), self._rebalancer.generation
        peers = {
            m.id: m
            for m in self._rebalancer.members.values()
            if m.id != self._who.id and m.live and not m.stopping and m.liveness
        }
        described = {i: str(m.liveness) for i, m in peers.items() if i not in self._declared}
        gone = self._membership.signal.gone(described)
        if not gone:
            return False
        with self._db.transaction() as conn:
            declared = [
                i for i in gone if self._membership.declare_gone(conn, i, described[i], GONE, stale)
            ]
            if declared:
                bump_generation(self._db, conn)
        self._declared.update(gone)  # those not declared here: another peer was first
        for peer in (peers[i] for i in declared):
            log.warning(
                "instance %s: declared instance %s (pid %d on %s) gone: %s; its partitions "
                "move now",
                self._who.name,
                peer.name,
                peer.pid,
                peer.host,
                GONE,
            )
        return bool(declared)

    def look(self) -> bool:
        """:meth:`beat`, a failure being no change (the regular round comes anyway), logged
        once: as the instance's outage if the database is unreachable, else at WARNING
        until a beat succeeds."""
        try:
            due = self.beat()
        except Exception as exc:
            if not self._outage.failed(exc):
                self._failing.failed(exc)
            return False
        self._outage.succeeded(wrote=False)
        self._failing.succeeded()
        return due

    def listen(self) -> None:
        """Take wake-ups from appenders on this host (before the loop starts)."""
        self._listener = self._db.wakeups.listen()

    def wake(self) -> None:
        """Make the loop look at its stop event now."""
        if self._listener is not None:
            self._listener.poke()

    def loop(self, stop: threading.Event) -> None:
        """Beat every ``idle-poll-interval`` (sooner when woken) until ``stop`` is set."""
        interval = self._settings.idle_poll_interval
        self._watchdog.watch("pulse", round_bound(self._settings, interval, db=self._db))
        due = time.monotonic()
        try:
            while not stop.is_set():
                left = due - time.monotonic()
                if left > 0:
                    woken = self._wait(stop, left)
                    if stop.is_set():
                        return
                    if not self._concerns(woken) and time.monotonic() < due:
                        continue
                started = time.monotonic()
                due = started + interval
                if self.look():
                    self._rebalancer.request_round()
                self._watchdog.beat("pulse")
                stop.wait(max(0.0, started + MIN_GAP - time.monotonic()))
        finally:
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    def _wait(self, stop: threading.Event, seconds: float) -> frozenset[str]:
        """The topics named by the wake-ups that came within ``seconds`` (none if none)."""
        if self._listener is None:
            stop.wait(seconds)
            return frozenset()
        return self._listener.wait(seconds)

    def _concerns(self, woken: frozenset[str]) -> bool:
        """Whether a wake-up about ``woken`` is worth a beat: any topic, or one read here."""
        return ANY_TOPIC in woken or not woken.isdisjoint(self.topics())
