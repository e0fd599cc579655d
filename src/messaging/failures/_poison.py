"""A message that cannot be decoded or handled, found within its batch, and its halt.

The buffered writes of a failed batch hide which message failed; the worker replays the
batch unbuffered to find it, then :func:`isolate` commits what came before it, so that
its partition's checkpoint stops right before it, and :func:`halt_partition` records
the halt. Nothing is skipped.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Sequence

import attrs
import pluggy

from messaging._lifecycle import lifecycle_event
from messaging.distribution._ownership import Claim, Ownership
from messaging.failures._failures import last_frames
from messaging.store._database import Database
from messaging.store._rows import POSITION, TYPE, StoredRow


class Poison(Exception):
    """A message that cannot be decoded or handled: its partition halts at it."""

    def __init__(
        self,
        row: StoredRow,
        partition: int | None,
        error: BaseException,
        batch: Sequence[StoredRow] = (),
        *,
        exact: bool = True,
    ) -> None:
        super().__init__(str(error))
        self.row = row
        self.partition = partition
        """None until looked up for a row read without its partition hash."""
        self.error = error
        self.batch = batch
        """The batch the failing message was in, to replay unbuffered."""
        self.exact = exact
        """False for a failure of the batch's writes as a whole, put on its last message:
        not one source's (it halts, never parks)."""

    def within(self, batch: Sequence[StoredRow]) -> Poison:
        """The same failure, known to be in ``batch``."""
        return Poison(self.row, self.partition, self.error, batch, exact=self.exact)


@attrs.frozen
class Isolated:
    """The poison message its partition halts at, and how many messages before it (in
    its batch) were committed."""

    poison: Poison
    committed: int


def isolate(poison: Poison, commit: Callable[[Sequence[StoredRow]], None]) -> Isolated:
    """Commit the messages of ``poison``'s batch before it with ``commit``. Should those
    fail as a whole (a write at the end of the prefix), the poison moves to the message
    the failure names, until a prefix commits or none is left."""
    positions = [row[POSITION] for row in poison.batch]
    while index := positions.index(poison.row[POSITION]):
        try:
            commit(poison.batch[:index])
        except Poison as earlier:
            poison = earlier.within(poison.batch)
            continue
        return Isolated(poison, index)
    return Isolated(poison, 0)


def halt_partition(
    db: Database,
    hooks: pluggy.HookRelay,
    consumer: str,
    instance_id: str,
    claim: Claim,
    poison: Poison,
    instance_name: str,
) -> bool:
    """Record the halt of ``claim``'s partition at ``poison`` (fenced by the claim), log
    it (as instance ``instance_name``) and tell the plugins; False when the fence no longer
    held (nothing halted)."""
    row, partition, error = poison.row, poison.partition, poison.error
    hooks.projections_message_failed(
        consumer=consumer,
        partition=partition,
        position=row[POSITION],
        type_name=row[TYPE],
        error=error,
        instance_id=instance_id,
    )
    detail = "".join(traceback.format_exception_only(error)).strip()
    with db.transaction() as conn:
        halted = Ownership(db).halt(
            conn,
            consumer,
            claim,
            instance_id,
            position=row[POSITION],
            type_name=row[TYPE],
            error=detail,
            trace=last_frames(error),
        )
    if halted:
        lifecycle_event(
            "halt",
            level=logging.ERROR,
            exc_info=error,
            consumer=consumer,
            partition=partition,
            instance=instance_name,
            instance_id=instance_id,
            epoch=claim.epoch,
            position=row[POSITION],
            type=row[TYPE],
            error=detail,
        )
        hooks.projections_partition_halted(
            consumer=consumer,
            partition=partition,
            position=row[POSITION],
            type_name=row[TYPE],
            error=detail,
            instance_id=instance_id,
        )
    return halted
