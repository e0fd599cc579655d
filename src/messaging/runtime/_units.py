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
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

import attrs

from messaging._consumers import ConsumerSpec
from messaging._lifecycle import lifecycle_event
from messaging._settings import Distribution, OnFailure
from messaging._states import ConsumerState
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._needs import published
from messaging.failures._parking import Parking
from messaging.store._database import Database
from messaging.versions._gate import VersionGate
from messaging.versions._versions import UnitRow, create_version_tables, split_unit

if TYPE_CHECKING:
    from messaging.runtime._instance import Instance

log = logging.getLogger("messaging.runtime.units")


class Units:
    """Starts and stops the workers of ``instance`` as its consumers' rows change."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.looping = False
        """Whether the apply loops run in threads (a worker started later gets one)."""
        self._engines: dict[int, Database] = {}

    def specs(self) -> dict[str, ConsumerSpec]:
        """The transactional consumers this instance declared and did not find stale."""
        inst = self.instance
        return {s.name: s for s in inst.specs if s.transactional and s.name in inst.fingerprints}

    def wanted(self, rows: Iterable[UnitRow]) -> dict[str, ConsumerSpec]:
        """The consumers (live versions or versions being built) to apply here, by name."""
        specs = self.specs()
        return {
            row.unit: specs[row.name]
            for row in rows
            if row.name in specs
            and row.fingerprint == self.instance.fingerprints[row.name]
            and (row.building or (row.live and row.state != ConsumerState.RETIRED))
        }

    def sync(self, rows: Iterable[UnitRow]) -> None:
        """Stop the workers of consumers not to apply any more, start those of new ones."""
        rows = list(rows)
        wanted = self.wanted(rows)
        live = {r.unit: r for r in rows if r.live}
        inst = self.instance
        changed = False
        for unit in [u for u in inst.workers if u not in wanted]:
            self._stop(unit, live.get(unit))
            changed = True
        for unit, spec in wanted.items():
            if unit not in inst.workers:
                self._start(unit, spec)
                changed = True
        if changed:
            inst.publish_runs(
                {
                    unit: {
                        "distribution": inst.distributions[split_unit(unit)[0]].value,
                        "fingerprint": inst.fingerprints[split_unit(unit)[0]],
                        # what it can read (messaging.distribution._needs)
                        **published(inst.registry, inst.workers[unit].spec),
                    }
                    for unit in inst.workers
                }
            )

    def _start(self, unit: str, spec: ConsumerSpec) -> None:
        inst = self.instance
        name, version = split_unit(unit)
        db, lanes = inst.db, self.lanes(spec)
        if version is not None:
            if not create_version_tables(inst.db, spec, unit, version):
                return  # it took over or was replaced since this round read it
            db = self._engines.get(version) or self._engines.setdefault(
                version, inst.db.for_version(version)
            )
            db.read_models.tables(spec.options.tables)  # its statements go to these now
            spec = attrs.evolve(spec, options=attrs.evolve(spec.options, name=unit))
        worker_class = spec.options.worker or spec.kind.worker or ConsumerWorker
        group = inst.group(spec)
        building = version is not None  # beside the live version, which it catches up
        parking = None
        default = OnFailure.HALT_PARTITION
        if spec.kind.parks and group.on_failure_for(name, default) is OnFailure.PARK_SOURCE:
            parking = Parking(db, spec.name, group.max_parked_sources)
        worker = worker_class(
            db=db,
            spec=spec,
            instance_id=inst.id,
            instance_name=inst.name,
            settings=group.consumer_settings_for(name, inst.consumer_settings),
            hooks=inst.hooks,
            registry=inst.registry,
            whole=inst.distributions[name] is Distribution.SINGLE_OWNER,
            lanes=lanes,
            limiter=inst.limiter,
            apply_timeout=group.apply_timeout_for(name),
            deadlines=inst.watchdog.applies,
            parking=parking,
            outage=inst.outage,
            pulsed=self.looping,
            gate=VersionGate(inst.db, name) if building else None,
            cutover_due=inst.rebalancer.request_round if building else None,  # live one waits
            sender=name,  # a version being built sends as the live one would (the same ids)
        )
        inst.workers[unit] = worker
        if self.looping:
            inst.spawn(f"apply:{unit}", worker.run)

    def _stop(self, unit: str, live: UnitRow | None) -> None:
        """Stop applying ``unit``: a version that took over or was replaced (said at INFO),
        or a live version whose declaration another replaced (said once, at WARNING)."""
        inst = self.instance
        name, version = split_unit(unit)
        if version is None:
            lifecycle_event(
                "declaration-mismatch",
                level=logging.WARNING,
                consumer=unit,
                instance=inst.name,
                instance_id=inst.id,
                declaration=inst.fingerprints.get(unit),
                current=None if live is None else live.fingerprint,
                reason="rebuilt under another declaration; applying nothing until restarted",
            )
        else:
            lifecycle_event(
                "version-done",
                consumer=name,
                version=version,
                instance=inst.name,
                reason="live now, or replaced by a newer declaration",
            )
        worker = inst.workers.pop(unit)
        # Released (right after a batch in flight): a peer may claim them at once.
        worker.holdings.hand_over(sorted(worker.claims()), partial(inst.rebalancer.release, unit))
        worker.retire()

    def lanes(self, spec: ConsumerSpec) -> int:
        """How many batches of ``spec`` this instance applies at once: its concurrency-limit,
        which only lowers ``executor.max-workers``. One on SQLite, whose single writer
        would only make parallel batches wait for each other."""
        inst = self.instance
        if inst.db.is_sqlite:
            return 1
        limit = inst.group(spec).concurrency_limit_for(spec.name)
        workers = inst.consumer_settings.executor.max_workers
        return min(workers, limit) if limit is not None else workers

    def close(self) -> None:
        """Close the engines of the versions built here."""
        for db in self._engines.values():
            db.dispose()
