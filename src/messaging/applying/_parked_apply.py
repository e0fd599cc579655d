"""How a worker parks sources and retries them (see :mod:`messaging.failures._parking`).

:meth:`ParkedApply.park_sources` turns a poison message into a parked source: the batch
is applied again with that source's messages from the poison on held back and its parked
row written, in the batch's fenced transaction (another failing source is parked the same
way), unless the partition already has ``max-parked-sources``: then it halts as today.
:meth:`ParkedApply.retry` applies the held messages of the sources an operator asked to
retry, in their original order, in one fenced transaction per source, before the
partition's next batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial

import attrs
from sqlalchemy import Connection, select

from messaging._consumers import ConsumerSpec
from messaging._lifecycle import Identity, lifecycle_event
from messaging.applying._batch import Batch
from messaging.applying._context import HandlerContext
from messaging.applying._dispatch import Dispatcher
from messaging.applying._fence import Fence
from messaging.distribution._ownership import Claim
from messaging.failures._parking import RETRYING_SKIPPED, NewPark, ParkedSource, Parking
from messaging.failures._poison import Poison
from messaging.failures._stops import Stops
from messaging.store._refusals import refusal
from messaging.store._retry import is_transient
from messaging.store._rows import PARTITION_HASH, POSITION, SOURCE, StoredRow
from messaging.store._store import MessageStore

Commit = Callable[[Batch, bool], Sequence[StoredRow]]
"""The worker's fenced commit of a batch (buffered, or ``immediate``): the rows applied."""
Applied = Callable[[Batch, Sequence[StoredRow], float], None]
"""What the worker does once rows of a batch committed (started at a perf-counter time)."""
Contexts = Callable[[Connection, Sequence[StoredRow], bool], HandlerContext]
"""The handler context the worker applies rows in (on a connection, ``immediate`` or not)."""


def held_back(rows: Sequence[StoredRow], held: Mapping[str, int]) -> list[StoredRow]:
    """``rows`` without those of ``held`` sources from their first held position on."""
    return [
        row for row in rows if (first := held.get(row[SOURCE])) is None or row[POSITION] < first
    ]


class ParkedApply:
    """Parks and retries the sources of one consumer's worker (``on-failure: park-source``).

    Given the worker's fenced commit of a batch (``commit``), what it does after one
    (``applied``) and the handler contexts it applies in (``contexts``)."""

    def __init__(
        self,
        *,
        spec: ConsumerSpec,
        store: MessageStore,
        dispatcher: Dispatcher,
        who: Identity,
        parking: Parking,
        fence: Fence,
        stops: Stops,
        commit: Commit,
        applied: Applied,
        contexts: Contexts,
    ) -> None:
        self._spec, self._store, self._dispatcher, self._who = spec, store, dispatcher, who
        self.parking = parking
        self._fence, self._stops = fence, stops
        self._commit, self._applied, self._contexts = commit, applied, contexts

    def with_sources(self, conn: Connection, rows: Sequence[StoredRow]) -> Sequence[StoredRow]:
        """``rows`` with their partition hash and the key each parks under (its source,
        looked up if read without; see :meth:`Dispatcher.parking_keys`)."""
        if not rows:
            return rows
        if len(rows[0]) <= SOURCE:
            envelopes = self._store.envelopes(conn, [row[POSITION] for row in rows])
            rows = [
                (
                    *row[:PARTITION_HASH],
                    envelopes[row[POSITION]].partition_hash,
                    envelopes[row[POSITION]].source,
                )
                for row in rows
            ]
        return self._dispatcher.parking_keys(rows)

    def park_sources(
        self, failed: Batch, replay: Sequence[StoredRow], poison: Poison, started: float
    ) -> int | None:
        """Commit the ``replay`` rows of the ``failed`` batch with the source of ``poison``
        parked (and of every other message that fails in it); return how many messages it
        committed. A failing source more than ``max-parked-sources`` in its partition halts
        the partition there (the sources parked before it in the batch are committed with
        the messages before it). None when that is the first failure of the batch and it
        cannot park: the caller halts as without parking."""
        parking = self.parking
        batch = Batch(failed.claims, replay, failed.through)
        with self._store.db.read() as conn:
            rows = self.with_sources(conn, replay)
        positions = [row[POSITION] for row in rows]
        parks: list[NewPark] = []
        while True:
            if not poison.exact:  # the batch's writes failed as a whole: no source to park
                return None
            # Raised while the framework handled the first failure: not its context.
            poison.error.__suppress_context__ = True
            index = positions.index(poison.row[POSITION])
            row = rows[index]
            partition = row[PARTITION_HASH] % self._spec.partitions
            parked = parking.count(partition) + sum(p.partition == partition for p in parks)
            unparkable = row[SOURCE] is None  # tied to no key it could park under
            if unparkable or parked >= parking.max_sources:
                lifecycle_event(
                    "park-escalated",
                    level=logging.WARNING,
                    consumer=self._spec.name,
                    partition=partition,
                    instance=self._who.name,
                    parked=parked,
                    reason="the failing message has no key to park under: it halts"
                    if unparkable
                    else f"{parked} sources are parked in it (max-parked-sources): it halts",
                )
                if not parks:
                    return None
                attempt = attrs.evolve(batch, rows=rows[:index], through=0, parks=tuple(parks))
                applied = self._commit_parks(attempt, started, immediate=True)
                poison.partition = partition
                self._stops.halt_at(poison, batch.claims)
                return applied
            parks.append(NewPark.of(row, partition, poison.error))
            attempt = attrs.evolve(batch, rows=rows, parks=tuple(parks))
            try:  # buffered first (the common case: one failing source); unbuffered to find it
                return self._commit_parks(attempt, started)
            except Poison:
                try:
                    return self._commit_parks(attempt, started, immediate=True)
                except Poison as again:
                    poison = again

    def _commit_parks(self, batch: Batch, started: float, *, immediate: bool = False) -> int:
        applied = self._commit(batch, immediate)
        self.parking.committed(batch.parks)
        for park in batch.parks:
            self._parked(park, batch.claims[park.partition].epoch)
        if applied:
            self._applied(batch, applied, started)
        return len(applied)

    def _parked(self, park: NewPark, epoch: int) -> None:
        name, who = self._spec.name, self._who
        who.hooks.projections_message_failed(
            consumer=name,
            partition=park.partition,
            position=park.position,
            type_name=park.type,
            error=park.exception or RuntimeError(park.error),
            instance_id=who.id,
        )
        who.hooks.projections_source_parked(
            consumer=name,
            partition=park.partition,
            source=park.source,
            position=park.position,
            type_name=park.type,
            instance_id=who.id,
        )
        lifecycle_event(
            "park",
            level=logging.ERROR,
            consumer=name,
            partition=park.partition,
            instance=who.name,
            instance_id=who.id,
            epoch=epoch,
            source=park.source,
            position=park.position,
            type=park.type,
            error=park.error,
        )

    def retry(self, claims: Mapping[int, Claim]) -> int:
        """Apply the held messages of the sources of ``claims`` an operator asked to retry;
        return how many were applied."""
        applied = 0
        for source in self.parking.retrying(claims):
            claim = claims[source.partition]
            applied += self._fence.guard(partial(self._replay, claim, source), claims, 0)
        return applied

    def _replay(self, claim: Claim, source: ParkedSource) -> int:
        """One fenced transaction: apply ``source``'s held messages (up to the first that
        fails again, which parks the source there) and delete (or move) its parked row. A
        retry of its skipped messages (:data:`RETRYING_SKIPPED`) applies them instead (up
        to the first that fails again: it and the rest stay skipped) and forgets them."""
        spec, parking, cut, again = self._spec, self.parking, None, None
        only_skipped = source.state == RETRYING_SKIPPED
        while True:
            try:
                with self._store.db.transaction(consumer=spec.name) as conn:
                    rows = source_rows(
                        self._store,
                        conn,
                        spec.topics,
                        source.source,
                        first=source.position,
                        last=claim.checkpoint,
                        types=self._dispatcher.type_names,
                    )
                    skipped = parking.skipped_positions(conn, source.source)
                    rows = [
                        row
                        for row in self._dispatcher.parking_keys(rows)
                        if row[SOURCE] == source.source
                        and (row[POSITION] in skipped) is only_skipped
                    ]
                    todo = rows if cut is None else rows[:cut]
                    self._apply(conn, todo)
                    if only_skipped:  # applied now; one failing again stays skipped
                        parking.forget_skipped(conn, [row[POSITION] for row in todo])
                    if again is None or only_skipped:
                        parking.release(conn, source)
                    else:
                        parking.write(conn, [again])
                    self._fence.commit(conn, {claim.partition: claim}, claim.checkpoint)
            except Poison as poison:
                if again is not None:  # the messages before it failed as a whole: park there
                    raise
                cut = [row[POSITION] for row in rows].index(poison.row[POSITION])
                again = NewPark.of(rows[cut], claim.partition, poison.error)
                continue
            break
        if again is None or only_skipped:
            parking.released(source)
            self._who.hooks.projections_source_retried(
                consumer=spec.name,
                partition=claim.partition,
                source=source.source,
                applied=len(todo),
                instance_id=self._who.id,
            )
            lifecycle_event(
                "retried",
                consumer=spec.name,
                partition=claim.partition,
                instance=self._who.name,
                source=source.source,
                applied=len(todo),
                skipped=only_skipped,
                failed=None if again is None else again.position,
            )
        else:
            parking.committed([again])
            self._parked(again, claim.epoch)
        return len(todo)

    def _apply(self, conn: Connection, rows: Sequence[StoredRow]) -> None:
        if not rows:
            return
        ctx = self._contexts(conn, rows, True)
        self._dispatcher.apply(rows, ctx, self._spec.partitions)
        try:
            ctx.flush()
        except Exception as exc:
            if is_transient(exc) or refusal(exc):
                raise
            last = rows[-1]
            partition = last[PARTITION_HASH] % self._spec.partitions
            raise Poison(last, partition, exc, exact=False) from exc


def source_rows(
    store: MessageStore,
    conn: Connection,
    topics: Sequence[str],
    source: str,
    *,
    first: int,
    last: int,
    types: Sequence[str],
) -> list[StoredRow]:
    """The messages of ``source`` in ``topics`` of ``types`` from position ``first`` to
    ``last``, in order, as batch rows with their source (a parked source's held
    messages; by the unique index of sources)."""
    m = store.db.schema.messages
    rows = conn.execute(
        select(*store.sourced_columns)
        .where(
            m.c.tenant == store.db.tenant,
            m.c.topic.in_(topics),
            m.c.source == source,
            m.c.position >= first,
            m.c.position <= last,
            m.c.type.in_(types),
        )
        .order_by(m.c.position)
    )
    return [tuple(row) for row in rows]
