"""The rebalance rounds of one instance: read the members, partitions and declarations,
plan this instance's share, release what moved away, claim the rest.

Rounds run every ``rebalance-interval`` (the safety net), right after a peer turns
stale, and at once when the instance's pulse (:mod:`messaging.runtime._pulser`) sees the
tenant's generation move: a join, a leave, a release, a stopping flag, a pause, a resume
or a rebuild.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence, Set
from functools import partial

import attrs

from messaging._lifecycle import Identity, partition_event
from messaging._states import ConsumerState, PartitionStatus
from messaging.applying._outage import Outage
from messaging.distribution._membership import InstanceRow, Membership
from messaging.distribution._needs import (
    Need,
    can_read,
    describe,
    pending,
    readable,
    reads_of,
    recorded,
)
from messaging.distribution._ownership import Ownership, PartitionRow
from messaging.distribution._pulse import read_generation
from messaging.distribution._rebalance import plan
from messaging.runtime._declared import Declared
from messaging.runtime._presence import Retry
from messaging.runtime._units import Units
from messaging.runtime._watchdog import Watchdog, round_bound
from messaging.store._database import Database
from messaging.store._store import MessageStore
from messaging.versions._cutover import step
from messaging.versions._declarations import start_requested_rebuild
from messaging.versions._versions import UnitRow, split_unit, unit_rows

log = logging.getLogger("messaging.runtime.rebalancer")

_EXPIRY_MARGIN = 0.05
"""Seconds after a peer's expiry to look again, so that it has really turned stale."""


@attrs.frozen
class Moved:
    """What one round changed here: partitions claimed and released."""

    claimed: int
    released: int


class Rebalancer:
    """The rebalance rounds of one instance and what they remember between rounds."""

    def __init__(
        self,
        *,
        db: Database,
        who: Identity,
        declared: Declared,
        membership: Membership,
        units: Units,
        retry: Retry,
        watchdog: Watchdog,
        outage: Outage,
        requested: threading.Event,
    ) -> None:
        self._db, self._who, self._declared = db, who, declared
        self._settings = declared.consumer_settings
        self._membership, self._units, self._retry = membership, units, retry
        self._watchdog, self._outage = watchdog, outage
        self._ownership = Ownership(db)
        self._store = MessageStore(db, declared.registry)
        self._requested = requested
        """Set when a round is asked for now (the pulse, a cutover due, the stop)."""
        self._next_round_in = self._settings.rebalance_interval
        self._waiting: dict[str, str | None] = {}
        self._needs_said: set[tuple[str, int, Need]] = set()
        """The partitions waiting for a newer declaration this instance has said so of."""
        self.generation: int | None = None
        """The tenant's generation as the last round read it, before its rows."""
        self._awaited: dict[str, int] = {}
        """Partitions of each consumer assigned here but still held by live peers."""
        self._for_operator: dict[str, str] = {}
        """What of each consumer's share waits for an operator, not a peer (halted, paused)."""
        self._awaiting_since: float | None = None
        self.members: dict[str, InstanceRow] = {}
        """The instances as the last round read them, by id."""

    def rebalance(self) -> None:
        """Compute the target from the database rows; release what moved away, claim the rest.

        A partition assigned elsewhere is released at once, or right after the batch in
        flight that applies it ended: a slow batch holds nothing else. Partitions
        assigned here are claimed when unowned or owned by a non-live instance; one still
        held by a live instance is claimed on a later round, after that instance let go.
        """
        started = time.perf_counter()
        timeout = self._settings.stale_instance_timeout
        self._requested.clear()
        with self._db.read() as conn:
            # The generation first: at READ COMMITTED each statement sees the latest commits,
            # so a change landing after the rows below were read bumps it past this value.
            self.generation = read_generation(self._db, conn)
            members = self._membership.instances(conn, timeout)
            self.members = {m.id: m for m in members}
            live = [i for i in members if i.live and not i.stopping]
            units = unit_rows(self._db, conn, self._declared.running())
        self._units.sync(units)  # the workers of the consumers to apply here
        read_at = time.monotonic()
        with self._db.read() as conn:
            rows = self._ownership.partitions(conn, sorted(self._units.workers))
            head = self._store.head(conn)
        read_seconds = time.perf_counter() - started
        moved = self._round(live, rows, units, read_at)
        self._who.hooks.projections_rebalanced(
            instance_id=self._who.id,
            seconds=time.perf_counter() - started,
            membership_seconds=read_seconds,
            live_members=len(live),
            claimed=moved.claimed,
            released=moved.released,
        )
        for name, worker in self._units.workers.items():
            lags = {p: max(0, head - c.checkpoint) for p, c in worker.claims().items()}
            self._who.hooks.projections_lag(consumer=name, instance_id=self._who.id, lags=lags)
            self._who.hooks.projections_ownership(
                consumer=name,
                instance_id=self._who.id,
                partitions=sorted(worker.claims()),
                total=worker.spec.partitions,
            )
        self._who.hooks.projections_versions(
            instance_id=self._who.id,
            live={u.name: u.version for u in units if u.live},
            building={u.name: u.version for u in units if u.building},
        )
        self._next_round_in = self._next_round(members)
        if self._awaiting_since is not None and not any(self._awaited.values()):
            waited = time.monotonic() - self._awaiting_since
            self._awaiting_since = None
            log.info(
                "instance %s: has its share of every consumer after %.1f s",
                self._who.name,
                waited,
            )

    def waiting(self) -> dict[str, str]:
        """Why this instance applies nothing of each consumer the last round planned
        nothing of here for a reason (by unit name), as the warning said."""
        return {name: why for name, why in self._waiting.items() if why}

    def announce_wait(self) -> None:
        """Say, once at start, what this instance waits for and for how long at most: the
        partitions assigned here that live peers still hold until their next round; and
        those no peer will hand over, which wait for an operator."""
        for_operator = [what for _, what in sorted(self._for_operator.items()) if what]
        if for_operator:
            log.info(
                "instance %s: %s: they wait for an operator, not for another instance",
                self._who.name,
                ", ".join(for_operator),
            )
        awaited = {name: n for name, n in self._awaited.items() if n}
        if not awaited:
            return
        self._awaiting_since = time.monotonic()
        interval = self._settings.rebalance_interval
        usually = min(1.0, interval)
        log.info(
            "instance %s: waiting for %s held by live instances: they hand them over at "
            "their next rebalance round, usually within %g s, at most %g s (two "
            "rebalance-intervals) plus a batch in flight",
            self._who.name,
            ", ".join(f"{n} partition(s) of {name}" for name, n in sorted(awaited.items())),
            usually,
            2 * interval,
        )

    def _round(
        self,
        live: list[InstanceRow],
        rows: list[PartitionRow],
        units: list[UnitRow],
        read_at: float,
    ) -> Moved:
        """One round's decisions from the rows just read (from ``read_at``, monotonic);
        returns what moved."""
        claimed = released = 0
        specs = self._declared.running()
        for unit in units:
            if unit.unit not in self._units.workers:
                continue
            spec = specs[unit.name]
            if unit.live and unit.state in (
                ConsumerState.REBUILD_REQUESTED,
                ConsumerState.REBUILDING,
            ):
                fingerprint = self._declared.fingerprints[unit.name]
                distribution = self._declared.distributions[unit.name]
                start_requested_rebuild(self._db, spec, fingerprint, distribution)
            elif unit.building:
                group = self._declared.group(spec)
                keep = group.retired_versions_for(spec.name)
                size = group.consumer_settings_for(spec.name, self._settings).batch_size
                step(self._db, spec, unit.unit, size, keep)
        declared = {u.unit: (u.fingerprint, u.state) for u in units}
        owners: dict[str, dict[int, str | None]] = {name: {} for name in self._units.workers}
        halted: dict[str, set[int]] = {name: set() for name in self._units.workers}
        needs_read: dict[str, set[int]] = {name: set() for name in self._units.workers}
        for row in rows:
            if row.consumer in owners:  # not one retired above
                owners[row.consumer][row.partition] = row.owner
                if row.status == PartitionStatus.HALTED:
                    halted[row.consumer].add(row.partition)
                if row.needs is not None:
                    needs_read[row.consumer].add(row.partition)
        needs = pending(rows)
        for name, worker in self._units.workers.items():  # left after the rows were read
            worker.needed = frozenset(needs.get(name, {}))
            for partition, (need, left_at) in list(worker.stops.left.items()):
                if left_at < read_at:
                    worker.stops.left.pop(partition, None)  # the rows hold the record
                else:
                    needs.setdefault(name, {})[partition] = need
        reads = {
            name: readable(self._declared.registry, w.spec)
            for name, w in self._units.workers.items()
        }
        plans = plan(
            self._who.id,
            live,
            owners,
            {name: worker.spec.partitions for name, worker in self._units.workers.items()},
            {
                name: self._declared.distributions[split_unit(name)[0]]
                for name in self._units.workers
            },
            {
                name: self._declared.fingerprints[split_unit(name)[0]]
                for name in self._units.workers
            },
            needs,
            reads,
            recorded(rows),
        )
        self._say_needs(needs, live, reads)
        for name, target in plans.items():
            worker = self._units.workers[name]
            lost = [p for p in worker.claims() if owners[name].get(p) != self._who.id]
            if lost:
                worker.drop(lost)
            if target.release:
                # Released now, or right after the batch in flight that applies them commits.
                worker.holdings.hand_over(
                    sorted(target.release), partial(self._units.release, name)
                )
                released += len(target.release)
            if target.waiting_for and target.waiting_for != self._waiting.get(name):
                log.warning("consumer %s: applying nothing here: %s", name, target.waiting_for)
            self._waiting[name] = target.waiting_for
            wanted = sorted(target.target - set(worker.claims()) - worker.holdings.leaving())
            if wanted:
                self._end_sessions({owners[name].get(p) for p in wanted})
                live_ids = self._membership.live_ids(self._settings.stale_instance_timeout)
                with self._db.transaction() as conn:
                    fingerprint = self._declared.fingerprints[split_unit(name)[0]]
                    claims = self._ownership.claim(
                        conn, name, wanted, self._who.id, live_ids, fingerprint, needs_read[name]
                    )
                worker.add_claims(claims)
                claimed += len(claims)
                for claim in claims:
                    partition_event(self._who, name, claim.partition, claim.epoch)
            unclaimed = target.target - set(worker.claims()) - worker.holdings.leaving()
            self._note_unclaimed(name, unclaimed, declared[name][1], halted[name])
        return Moved(claimed=claimed, released=released)

    def _note_unclaimed(self, name: str, unclaimed: Set[int], state: str, halted: Set[int]) -> None:
        """Sort the partitions of ``name`` assigned here but not claimed: those of a paused
        consumer and halted ones wait for an operator (``projections resume``), the rest
        for the live peers that hold them."""
        paused = state == ConsumerState.PAUSED
        stuck = unclaimed if paused else unclaimed & halted
        self._awaited[name] = len(unclaimed - stuck)
        why = "paused" if paused else "halted"
        self._for_operator[name] = (
            f"{len(stuck)} partition(s) of {name} {why} (`projections resume {name}`)"
            if stuck
            else ""
        )

    def _end_sessions(self, owners: set[str | None]) -> None:
        """Before taking partitions from ``owners``: end the MySQL sessions of those that
        are stale, so that the row locks of a batch they froze in go at once and its
        commit fails (:meth:`messaging.store._sessions.Sessions.end`)."""
        if self._db.sessions is None:
            return
        for owner in owners:
            member = self.members.get(owner or "")
            if member is None or member.live or not member.sessions:
                continue
            ended = self._db.sessions.end(member.sessions, member.name)
            if ended:
                log.warning(
                    "instance %s: ended %d database session(s) of stale instance %s: its "
                    "locks are gone and its late commits fail",
                    self._who.name,
                    ended,
                    member.name,
                )

    def _say_needs(
        self,
        needs: dict[str, dict[int, Need]],
        live: list[InstanceRow],
        reads: dict[str, dict[str, int]],
    ) -> None:
        """Say once of each partition of this instance's consumers that waits for a newer
        declaration no live instance has (``reads``: what this one reads of each)."""
        for name, waiting in needs.items():
            if name not in reads:
                continue
            for partition, need in waiting.items():
                said = (name, partition, need)
                able = can_read(reads[name], need) or any(
                    can_read(reads_of(i, name), need) for i in live
                )
                if not able and said not in self._needs_said:
                    self._needs_said.add(said)
                    log.warning(
                        "consumer %s partition %d waits: it %s, which no live instance has",
                        name,
                        partition,
                        describe(need),
                    )

    def _next_round(self, members: Sequence[InstanceRow]) -> float:
        """How soon the next rebalance is worth running: at the regular interval, but right
        after a peer that stopped heartbeating turns stale, and soon while a peer is
        stopping (its partitions are about to be released). Costs no query while nothing
        happens: the times come from the rows this round read anyway."""
        interval = self._settings.rebalance_interval
        peers = [m for m in members if m.id != self._who.id and m.live]
        soonest = interval
        if any(m.stopping for m in peers):
            soonest = interval / 4
        expiring = [m.expires_in + _EXPIRY_MARGIN for m in peers if not m.stopping]
        return max(0.0, min([soonest, *expiring]))

    def awaiting(self) -> bool:
        """Whether the last round left partitions assigned here in a live peer's hands (a
        release is then worth a round; see :func:`~messaging.distribution._pulse.only_releases`).
        """
        return any(self._awaited.values())

    def request_round(self) -> None:
        """Run a round now (the pulse saw the generation move), or wake the loop to stop."""
        self._requested.set()

    def _wait_for_round(self, stop: threading.Event, started: float) -> bool:
        """Wait until the next round is due or one is asked for; False once stopped."""
        self._requested.wait(max(0.0, started + self._next_round_in - time.monotonic()))
        return not stop.is_set()

    def loop(self, stop: threading.Event) -> None:
        interval = self._settings.rebalance_interval
        self._watchdog.watch("rebalance", round_bound(self._settings, interval, db=self._db))
        started = time.monotonic()
        while self._wait_for_round(stop, started):
            started = time.monotonic()
            try:
                self._retry(self.rebalance, "rebalance")
            except Exception as exc:
                self._next_round_in = interval
                if not self._outage.failed(exc):
                    log.exception(
                        "instance %s: rebalance failed; trying again next round", self._who.name
                    )
            else:
                self._outage.succeeded(wrote=False)  # a round may have written nothing
            self._watchdog.beat("rebalance")
