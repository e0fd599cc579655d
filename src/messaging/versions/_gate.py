"""What a version being built may apply and send, so that nothing is sent twice.

While the live version applies, it sends whatever its handlers send. A version being
built replays the same messages: it must not send again what the live version sent, nor
send for a message before the live version has applied it (the live version would send
it too). So a version being built applies a message the live version handles only once
the live version's checkpoint of that message's partition (in the live version's
partitioning) has passed it, and its sends and appends for such a message are dropped.
A message the live version does not handle is dropped likewise while it is not past
every live checkpoint (a new handler's effects for old messages are not sent).

Once the live version stopped for the cutover (:mod:`messaging.versions._cutover`), its
checkpoints are final: a version applies past them, sending what the live version did
not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sqlalchemy import Connection, select

from messaging._messages import Envelope
from messaging.store._database import Database
from messaging.store._rows import PARTITION_HASH, POSITION, TYPE, StoredRow


class VersionGate:
    """The live version of ``name`` as a version being built must see it, re-read per batch."""

    def __init__(self, db: Database, name: str) -> None:
        self.db = db
        self.name = name
        self._checkpoints: dict[int, int] = {}
        self._partitions = 1
        self._types: frozenset[str] = frozenset()
        self._stopped = False
        self._asked: bool | None = None  # the live version's stop when a step was last due

    def due(self, applied: int, batch_size: int) -> bool:
        """Whether a poll of the version that applied ``applied`` messages should ask for the
        next cutover step now: near its end (within a batch of the live version, or that
        stopped), after progress or once the live version stopped. An idle poll with nothing
        changed asks no more (a paused live version or a held swap would get a round per
        poll): the rebalance rounds go on meanwhile."""
        if not (self._stopped or applied < batch_size):
            self._asked = None
            return False
        if applied or self._asked != self._stopped:
            self._asked = self._stopped
            return True
        return False

    def read(self, conn: Connection) -> None:
        """Read the live version's checkpoints (final ones once it stopped), partition count
        and handled types."""
        t = self.db.schema.consumers
        row = conn.execute(
            select(t.c.partitions, t.c.types, t.c.cutover).where(
                t.c.tenant == self.db.tenant, t.c.name == self.name
            )
        ).one_or_none()
        if row is None:  # nothing live (yet): nothing was sent
            self._checkpoints, self._stopped = {}, True
            return
        self._partitions, self._types = int(row.partitions), frozenset(json.loads(row.types))
        cutover = json.loads(row.cutover) if row.cutover else None
        self._stopped = cutover is not None
        if cutover is not None:
            self._checkpoints = {int(p): int(c) for p, c in cutover["checkpoints"].items()}
            self._partitions = int(cutover["partitions"])
            return
        p = self.db.schema.partitions
        self._checkpoints = dict(
            conn.execute(
                select(p.c.partition_no, p.c.checkpoint).where(
                    p.c.tenant == self.db.tenant, p.c.consumer == self.name
                )
            ).all()
        )

    def _applied_live(self, position: int, partition_hash: int, type_name: str) -> bool:
        """Whether the live version applied (and so sent the effects of) this message."""
        if type_name in self._types:
            return position <= self._checkpoints.get(partition_hash % self._partitions, 0)
        return position <= max(self._checkpoints.values(), default=0)

    def cap(self, rows: Sequence[StoredRow]) -> Sequence[StoredRow]:
        """``rows`` up to the first one the live version, still applying, has not applied
        yet (all of them once it stopped)."""
        if self._stopped:
            return rows
        for i, row in enumerate(rows):
            if row[TYPE] in self._types and not self._applied_live(
                row[POSITION], row[PARTITION_HASH], row[TYPE]
            ):
                return rows[:i]
        return rows

    def quiet(self, envelope: Envelope) -> bool:
        """Whether the sends and appends of handling ``envelope`` are dropped."""
        return self._applied_live(envelope.position, envelope.partition_hash, envelope.type)

    def behind(self, rows: Sequence[StoredRow]) -> int:
        """How many of ``rows`` (read after a version's checkpoints) the live version has
        applied: what the version still has to apply to include everything the live one
        has."""
        return sum(
            1 for row in rows if self._applied_live(row[POSITION], row[PARTITION_HASH], row[TYPE])
        )

    @property
    def checkpoints(self) -> Mapping[int, int]:
        return self._checkpoints

    @property
    def stopped(self) -> bool:
        """Whether the live version had stopped for the cutover, when last read."""
        return self._stopped
