"""Route consumers: the handlers of the messages sent to a destination.

Send with :meth:`MessageStore.send` in the application's transaction, or with
:meth:`HandlerContext.send` from any consumer's handler: either way the message is
stored only if that transaction commits. A destination is a topic; its route consumer
is partitioned (by the send's ``key``) and handed over like any partitioned consumer.

Route consumers are **at-least-once**: an effect outside the database happens again
when a batch is applied again after a crash, and a sender outside a consumer may send
twice. With ``idempotent=True`` the framework records the id of every message it
handled in the handler's own transaction, and skips a message whose id it has already
recorded: database effects of the handler then happen once per message id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Table, bindparam, insert, select
from sqlalchemy.exc import IntegrityError

from messaging._consumers import DEFAULT_PARTITIONS, ConsumerOptions, mark_consumer
from messaging._errors import ConcurrentUpdate
from messaging._kinds import ConsumerKind, register_kind
from messaging.applying._context import HandlerContext
from messaging.applying._dispatch import Dispatcher
from messaging.applying._worker import ConsumerWorker
from messaging.store._database import take_write_lock
from messaging.store._rows import POSITION, StoredRow

C = TypeVar("C", bound=type)

_ID_CHUNK = 500

ROUTE_CONSUMER = register_kind(
    ConsumerKind(
        value="route-consumer",
        article="a route consumer",
        settings_group="routing",
        no_concurrency_limit="route consumers have no concurrency limit (only projections do)",
        records_handled_ids=True,
        parks=True,
    )
)
"""Route consumers: applied in fenced batches, never rebuilt (a replay would repeat
their effects beyond their own tables)."""


def route_consumer(
    destination: str,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    idempotent: bool = False,
    tables: Iterable[Table] = (),
) -> Callable[[C], C]:
    """Declare the consumer of the messages sent to ``destination`` (also its name).

    Handlers are methods marked with :func:`messaging.handler`. With ``idempotent``
    a message id already handled is skipped, recorded in the handler's transaction.
    ``tables`` it writes are created at start (never dropped: it is not rebuilt).
    """
    options = ConsumerOptions(
        name=destination,
        kind=ROUTE_CONSUMER,
        topics=(destination,),
        partitions=partitions,
        tables=tuple(tables),
        worker=IdempotentWorker if idempotent else None,
    )

    def decorate(cls: C) -> C:
        mark_consumer(cls, options)
        return cls

    return decorate


class IdempotentDispatcher(Dispatcher):
    """Skips messages whose id this consumer has handled, and records the ids it handles."""

    def _record(self) -> Any:
        """The insert of handled ids, stamped with the clock's time now."""
        return insert(self.db.schema.processed).values(
            tenant=self.db.tenant,
            consumer=self.spec.name,
            message_id=bindparam("message"),
            position=bindparam("at_position"),
            processed_at=self.db.clock.now(),
        )

    def apply(self, rows: Sequence[StoredRow], ctx: HandlerContext, partition_count: int) -> None:
        envelopes = ctx.envelopes
        ids = {row[POSITION]: envelopes[row[POSITION]].message_id for row in rows}
        seen = self._handled(ctx, [i for i in ids.values() if i is not None])
        fresh = []
        records: list[dict[str, Any]] = []
        for row in rows:
            message_id = ids[row[POSITION]]
            if message_id is not None:
                if message_id in seen:
                    continue
                seen.add(message_id)
                records.append({"message": message_id, "at_position": row[POSITION]})
            fresh.append(row)
        super().apply(fresh, ctx, partition_count)
        if records:
            conn = ctx.connection
            take_write_lock(conn)  # (SQLite: handlers ran without it)
            try:
                conn.execute(self._record(), records)
            except IntegrityError as exc:
                # Another batch (another lane or instance) handled one of these ids and
                # committed first: this batch retries, and skips it.
                raise ConcurrentUpdate(
                    f"{self.spec.name}: a message id was handled concurrently"
                ) from exc

    def _handled(self, ctx: HandlerContext, ids: list[str]) -> set[str]:
        table = self.db.schema.processed
        found: set[str] = set()
        for start in range(0, len(ids), _ID_CHUNK):
            found.update(
                ctx.connection.execute(
                    select(table.c.message_id).where(
                        table.c.tenant == self.db.tenant,
                        table.c.consumer == self.spec.name,
                        table.c.message_id.in_(ids[start : start + _ID_CHUNK]),
                    )
                ).scalars()
            )
        return found


class IdempotentWorker(ConsumerWorker):
    """A route consumer's worker with the idempotency guard."""

    dispatcher_class = IdempotentDispatcher
