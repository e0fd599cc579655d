"""The consumers one instance applies, and their workers, as the rebalance rounds find them.

For each transactional consumer it runs, an instance applies the live version when the
database holds its declaration, and every version of it being built under its
declaration (:mod:`messaging.versions._versions`): a requested rebuild builds a version
on every instance running the projection; a changed declaration builds its version on
the instances that run it, while the others keep the live one current. After a
cutover, the instances whose declaration went live apply it under its own name, the
others stop applying it and say so once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import attrs

from messaging._consumers import ConsumerSpec
from messaging._lifecycle import Identity, lifecycle_event, partition_event
from messaging._settings import Distribution, OnFailure
from messaging._states import ConsumerState
from messaging.applying._apply_timeout import ApplyDeadlines
from messaging.applying._outage import Outage
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._ownership import Ownership
from messaging.distribution._pulse import bump_generation
from messaging.failures._parking import Parking
from messaging.runtime._declared import Declared
from messaging.runtime._presence import Retry
from messaging.runtime._threads import Loop
from messaging.store._database import Database
from messaging.versions._gate import VersionGate
from messaging.versions._versions import UnitRow, create_version_tables, split_unit

log = logging.getLogger("messaging.runtime.units")


class Units:
    """Starts and stops an instance's workers as its consumers' rows change; releases the
    partitions they hand over."""

    def __init__(
        self,
        *,
        db: Database,
        who: Identity,
        declared: Declared,
        publish_runs: Callable[[Mapping[str, Mapping[str, Any]]], None],
        retry: Retry,
        cutover_due: Callable[[], object],
        deadlines: ApplyDeadlines,
        outage: Outage,
    ) -> None:
        self._db, self._who, self._declared = db, who, declared
        self._publish_runs, self._retry, self._cutover_due = publish_runs, retry, cutover_due
        self._deadlines, self._outage = deadlines, outage
        self._ownership = Ownership(db)
        settings = declared.consumer_settings
        self._limiter = threading.BoundedSemaphore(settings.executor.max_workers)
        """Bounds the batches applied at once across every consumer of the instance."""
        self.workers: dict[str, ConsumerWorker] = {}
        """The workers by unit name (a consumer, or a version of it being built)."""
        self._spawn: Callable[[str, Loop], None] | None = None
        self._after_first_batch: Callable[[], object] | None = None
        self._engines: dict[int, Database] = {}

    def loop(
        self, spawn: Callable[[str, Loop], None], after_first_batch: Callable[[], object] | None
    ) -> None:
        """Run the apply loops in threads (``spawn``) from now on, those of the workers
        started so far and of those started later, all woken by the instance's pulse."""
        self._spawn, self._after_first_batch = spawn, after_first_batch
        for unit, worker in self.workers.items():
            worker.pulsed = True
            worker.after_first_batch = after_first_batch
            worker.respawn = partial(spawn, f"apply:{unit}")
            spawn(f"apply:{unit}", worker.run)

    def wanted(self, rows: Iterable[UnitRow]) -> dict[str, ConsumerSpec]:
        """The consumers (live versions or versions being built) to apply here, by name."""
        specs = self._declared.running()
        return {
            row.unit: specs[row.name]
            for row in rows
            if row.name in specs
            and row.fingerprint == self._declared.fingerprints[row.name]
            and (row.building or (row.live and row.state != ConsumerState.RETIRED))
        }

    def sync(self, rows: Iterable[UnitRow]) -> None:
        """Stop the workers of consumers not to apply any more, start those of new ones."""
        rows = list(rows)
        wanted = self.wanted(rows)
        live = {r.unit: r for r in rows if r.live}
        changed = False
        for unit in [u for u in self.workers if u not in wanted]:
            self._stop(unit, live.get(unit))
            changed = True
        for unit, spec in wanted.items():
            if unit not in self.workers:
                self._start(unit, spec)
                changed = True
        if changed:
            run_of = self._declared.run_of
            self._publish_runs(
                {
                    unit: run_of(split_unit(unit)[0], worker.spec)
                    for unit, worker in self.workers.items()
                }
            )

    def _start(self, unit: str, spec: ConsumerSpec) -> None:
        declared = self._declared
        name, version = split_unit(unit)
        db, lanes = self._db, self.lanes(spec)
        if version is not None:
            if not create_version_tables(self._db, spec, unit, version):
                return  # it took over or was replaced since this round read it
            db = self._engines.get(version) or self._engines.setdefault(
                version, self._db.for_version(version)
            )
            db.read_models.tables(spec.options.tables)  # its statements go to these now
            spec = attrs.evolve(spec, options=attrs.evolve(spec.options, name=unit))
        worker_class = spec.options.worker or spec.kind.worker or ConsumerWorker
        group = declared.group(spec)
        building = version is not None  # beside the live version, which it catches up
        parking = None
        default = OnFailure.HALT_PARTITION
        if spec.kind.parks and group.on_failure_for(name, default) is OnFailure.PARK_SOURCE:
            parking = Parking(db, spec.name, group.max_parked_sources)
        worker = worker_class(
            db=db,
            spec=spec,
            instance_id=self._who.id,
            instance_name=self._who.name,
            settings=group.consumer_settings_for(name, declared.consumer_settings),
            hooks=self._who.hooks,
            registry=declared.registry,
            whole=declared.distributions[name] is Distribution.SINGLE_OWNER,
            lanes=lanes,
            limiter=self._limiter,
            apply_timeout=group.apply_timeout_for(name),
            deadlines=self._deadlines,
            parking=parking,
            outage=self._outage,
            pulsed=self._spawn is not None,
            after_first_batch=self._after_first_batch,
            gate=VersionGate(self._db, name) if building else None,
            cutover_due=self._cutover_due if building else None,  # the live one waits
            sender=name,  # a version being built sends as the live one would (the same ids)
        )
        self.workers[unit] = worker
        if self._spawn is not None:
            worker.respawn = partial(self._spawn, f"apply:{unit}")
            self._spawn(f"apply:{unit}", worker.run)

    def _stop(self, unit: str, live: UnitRow | None) -> None:
        """Stop applying ``unit``: a version that took over or was replaced (said at INFO),
        or a live version whose declaration another replaced (said once, at WARNING)."""
        who = self._who
        name, version = split_unit(unit)
        if version is None:
            lifecycle_event(
                "declaration-mismatch",
                level=logging.WARNING,
                consumer=unit,
                instance=who.name,
                instance_id=who.id,
                declaration=self._declared.fingerprints.get(unit),
                current=None if live is None else live.fingerprint,
                reason="rebuilt under another declaration; applying nothing until restarted",
            )
        else:
            lifecycle_event(
                "version-done",
                consumer=name,
                version=version,
                instance=who.name,
                reason="live now, or replaced by a newer declaration",
            )
        worker = self.workers.pop(unit)
        # Released (right after a batch in flight): a peer may claim them at once.
        worker.holdings.hand_over(sorted(worker.claims()), partial(self.release, unit))
        worker.retire()

    def release(self, name: str, partitions: Sequence[int]) -> None:
        """Give up ``partitions`` of ``name``, handed over by its worker."""

        def release() -> None:
            with self._db.transaction() as conn:
                self._ownership.release(conn, name, self._who.id, partitions)
                bump_generation(self._db, conn, release=True)  # for the one awaiting them

        self._retry(release, f"release {name}")
        for partition in partitions:
            partition_event(self._who, name, partition, None)

    def lanes(self, spec: ConsumerSpec) -> int:
        """How many batches of ``spec`` this instance applies at once: its concurrency-limit,
        which only lowers ``executor.max-workers``. One on SQLite, whose single writer
        would only make parallel batches wait for each other."""
        if self._db.is_sqlite:
            return 1
        limit = self._declared.group(spec).concurrency_limit_for(spec.name)
        workers = self._declared.consumer_settings.executor.max_workers
        return min(workers, limit) if limit is not None else workers

    def wake(self) -> None:
        """Wake every worker (the instance is stopping)."""
        for worker in self.workers.values():
            worker.wake()

    def close(self) -> None:
        """Close the engines of the versions built here."""
        for db in self._engines.values():
            db.dispose()
