"""Parked sources (``on-failure: park-source``): a failing message sets its source aside.

A consumer's parked source has one row in ``parked_sources``: the position of its first
parked message (the head), the failure, and its state (``parked``, or ``retrying`` once
an operator asked for a retry). Every message of that source from the head on is held
back: the worker reads it, does not apply it, and moves its checkpoint past it, so the
rest of the partition goes on. The held messages are the source's messages from the
head up to the partition's checkpoint; a retry applies them in their original order, in
one fenced transaction that also deletes the row, before any newer message of the source.

The parked rows of a partition are read when it is claimed (:meth:`Parking.load`) and
change only in fenced commits (the worker's batch, or an operator command that fences
the partition, which makes its owner claim it again): a partition without parked
sources costs no statement more per batch.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterable, Sequence

import attrs
from sqlalchemy import Connection, delete, insert, select, update

from messaging.failures._failures import last_frames
from messaging.store._database import Database
from messaging.store._rows import POSITION, SOURCE, TYPE, StoredRow

PARKED = "parked"
RETRYING = "retrying"
RETRYING_SKIPPED = "retry-skipped"
"""A source whose skipped messages an operator asked to apply (once, in their order)."""


@attrs.frozen(kw_only=True)
class ParkedSource:
    """A source held back in one partition of a consumer, from ``position`` on."""

    source: str
    partition: int
    position: int
    state: str = PARKED


@attrs.frozen(kw_only=True)
class NewPark:
    """A source a batch parks (written in the batch's transaction)."""

    source: str
    partition: int
    position: int
    type: str
    error: str
    trace: str
    exception: BaseException | None = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def of(cls, row: StoredRow, partition: int, error: BaseException) -> NewPark:
        return cls(
            source=row[SOURCE],
            partition=partition,
            position=row[POSITION],
            type=row[TYPE],
            error="".join(traceback.format_exception_only(error)).strip(),
            trace=last_frames(error),
            exception=error,
        )


class Parking:
    """The parked sources of the partitions one worker holds (for consumer ``unit``)."""

    def __init__(self, db: Database, unit: str, max_sources: int) -> None:
        self.db = db
        self.unit = unit
        self.max_sources = max_sources
        """More parked sources than this in one partition halt it instead."""
        self.table = db.schema.parked
        self._lock = threading.Lock()
        self._parked: dict[int, dict[str, ParkedSource]] = {}

    # -- what this worker knows ------------------------------------------------------------

    def load(self, conn: Connection, partitions: Iterable[int]) -> None:
        """Read the parked sources of ``partitions`` (claimed again: what the database holds)."""
        wanted = sorted(partitions)
        if not wanted:
            return
        t = self.table
        found: dict[int, dict[str, ParkedSource]] = {p: {} for p in wanted}
        for r in conn.execute(
            select(t.c.source, t.c.partition_no, t.c.position, t.c.state).where(
                t.c.tenant == self.db.tenant,
                t.c.consumer == self.unit,
                t.c.partition_no.in_(wanted),
            )
        ):
            found[r.partition_no][r.source] = ParkedSource(
                source=r.source, partition=r.partition_no, position=r.position, state=r.state
            )
        with self._lock:
            for partition, sources in found.items():
                if sources:
                    self._parked[partition] = sources
                else:
                    self._parked.pop(partition, None)

    def reload(self, partitions: Iterable[int]) -> None:
        """:meth:`load` in a read transaction of its own."""
        with self.db.read() as conn:
            self.load(conn, partitions)

    def forget(self, partitions: Iterable[int]) -> None:
        with self._lock:
            for partition in partitions:
                self._parked.pop(partition, None)

    def held(self, partitions: Iterable[int], parks: Sequence[NewPark] = ()) -> dict[str, int]:
        """Source → the first position held back, for ``partitions`` and ``parks``; empty
        (the common case) when none of them has a parked source."""
        with self._lock:
            held = {
                s.source: s.position
                for p in partitions
                if (sources := self._parked.get(p))
                for s in sources.values()
            }
        for park in parks:
            held.setdefault(park.source, park.position)
        return held

    def count(self, partition: int) -> int:
        with self._lock:
            return len(self._parked.get(partition, ()))

    def retrying(self, partitions: Iterable[int]) -> list[ParkedSource]:
        """The sources of ``partitions`` an operator asked to retry, by head position."""
        with self._lock:
            found = [
                s
                for p in partitions
                for s in self._parked.get(p, {}).values()
                if s.state in (RETRYING, RETRYING_SKIPPED)
            ]
        return sorted(found, key=lambda s: s.position)

    def committed(self, parks: Iterable[ParkedSource | NewPark]) -> None:
        """After a commit parked these sources (or parked a retried one again)."""
        with self._lock:
            for park in parks:
                self._parked.setdefault(park.partition, {})[park.source] = ParkedSource(
                    source=park.source, partition=park.partition, position=park.position
                )

    def released(self, source: ParkedSource) -> None:
        """After a commit applied a retried source."""
        with self._lock:
            sources = self._parked.get(source.partition, {})
            sources.pop(source.source, None)
            if not sources:
                self._parked.pop(source.partition, None)

    # -- the fenced writes (inside a batch's transaction) ----------------------------------

    def write(self, conn: Connection, parks: Sequence[NewPark]) -> None:
        """Record ``parks`` (a retried source parked again replaces its row)."""
        if not parks:
            return
        t, now = self.table, self.db.clock.now()
        sources = [park.source for park in parks]
        conn.execute(
            delete(t).where(
                t.c.tenant == self.db.tenant, t.c.consumer == self.unit, t.c.source.in_(sources)
            )
        )
        for park in parks:
            conn.execute(
                insert(t).values(
                    tenant=self.db.tenant,
                    consumer=self.unit,
                    source=park.source,
                    partition_no=park.partition,
                    position=park.position,
                    type=park.type,
                    error=park.error,
                    trace=park.trace,
                    parked_at=now,
                    state=PARKED,
                )
            )

    def release(self, conn: Connection, source: ParkedSource) -> None:
        """Delete the row of a source whose held messages were applied."""
        t = self.table
        conn.execute(
            delete(t).where(
                t.c.tenant == self.db.tenant,
                t.c.consumer == self.unit,
                t.c.source == source.source,
            )
        )

    def forget_skipped(self, conn: Connection, positions: Sequence[int]) -> None:
        """Delete the skipped records of ``positions`` (applied by a retry now)."""
        s = self.db.schema.skipped
        if positions:
            conn.execute(
                delete(s).where(
                    s.c.tenant == self.db.tenant,
                    s.c.consumer == self.unit,
                    s.c.position.in_(list(positions)),
                )
            )

    def skipped_positions(self, conn: Connection, source: str) -> set[int]:
        """The positions of ``source`` an operator skipped (a retry leaves them out)."""
        s = self.db.schema.skipped
        return set(
            conn.execute(
                select(s.c.position).where(
                    s.c.tenant == self.db.tenant, s.c.consumer == self.unit, s.c.source == source
                )
            ).scalars()
        )


def swap_parked(db: Database, conn: Connection, live: str, retired: str, building: str) -> None:
    """At a cutover: the parked and skipped rows of ``live`` go to ``retired`` (whose own are
    dropped with it), those of the version ``building`` become ``live``'s."""
    for table in (db.schema.parked, db.schema.skipped):
        mine = (table.c.tenant == db.tenant,)
        conn.execute(delete(table).where(*mine, table.c.consumer == retired))
        for old, new in ((live, retired), (building, live)):
            conn.execute(update(table).where(*mine, table.c.consumer == old).values(consumer=new))
