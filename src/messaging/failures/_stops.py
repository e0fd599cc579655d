"""Where a worker's partition stops at a message: a poison message (or one whose handler
outlasted the apply timeout) halts its partition there; a payload newer than this code
leaves the partition to an instance that can read it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from messaging._consumers import ConsumerSpec
from messaging._errors import UnknownPayloadVersion
from messaging._lifecycle import Identity
from messaging.distribution._needs import describe, leave
from messaging.distribution._ownership import Claim
from messaging.failures._poison import Poison, halt_partition
from messaging.store._database import Database
from messaging.store._rows import POSITION
from messaging.store._store import MessageStore

SAY_EVERY = 60.0
"""Seconds between two lines about partitions left for the same newer payload."""

log = logging.getLogger("messaging.runtime.worker")

Need = tuple[str, int]
"""What a partition left for a newer declaration needs: a type name and its version."""


class Stops:
    """Halts and leaves partitions of one consumer's worker, which hands them ``drop``
    (the worker stops applying them) and reads :attr:`left` back (the rebalance rounds)."""

    def __init__(
        self,
        *,
        db: Database,
        store: MessageStore,
        spec: ConsumerSpec,
        who: Identity,
        drop: Callable[[Sequence[int]], None],
    ) -> None:
        self._db, self._store, self._spec, self._who, self._drop = db, store, spec, who, drop
        self.left: dict[int, tuple[Need, float]] = {}
        """Partitions left for a newer declaration: what each needs, and when (monotonic).
        A rebalance round that read the rows before that does not claim them back."""
        self._said: dict[Need, tuple[float, int]] = {}
        """Per need, when a leave for it was last logged (monotonic) and how many leaves
        for it went unsaid since: one line per cause a minute (:data:`SAY_EVERY`)."""

    def stop_before(self, poison: Poison, claims: Mapping[int, Claim]) -> None:
        """Stop ``poison``'s partition at it: leave it to an instance that can read a
        payload newer than this code, or halt it there."""
        if isinstance(poison.error, UnknownPayloadVersion):
            self.leave_at(poison, claims)
        else:
            self.halt_at(poison, claims)

    def leave_at(self, poison: Poison, claims: Mapping[int, Claim]) -> None:
        """Stop before ``poison``, a payload newer than this code: record what its partition
        needs, release it to an instance that can read it (``distribution._needs``), say
        why once."""
        error = poison.error
        assert isinstance(error, UnknownPayloadVersion)
        if error.position is None:  # a newer saga state read for the message: stop before it
            position = poison.row[POSITION]
            error = UnknownPayloadVersion(error.type_name, error.version, position=position)
        self.leave(claims[self.partition_of(poison)], error)

    def leave(
        self, claim: Claim, error: UnknownPayloadVersion, deadline: str | None = None
    ) -> None:
        """Release ``claim``'s partition to an instance that can read what ``error`` names
        (at a message's position, or a saga's ``deadline``), recording what it needs; say
        why once."""
        where = f"position {error.position}" if deadline is None else deadline
        name, partition = self._spec.name, claim.partition
        if leave(self._db, name, claim, self._who.id, error, deadline):
            need, now = (error.type_name, error.version), time.monotonic()
            self.left[partition] = (need, now)
            said_at, unsaid = self._said.get(need, (-SAY_EVERY, 0))
            if now - said_at < SAY_EVERY:
                self._said[need] = (said_at, unsaid + 1)
            else:
                self._said[need] = (now, 0)
                more = f"; {unsaid} more left for it since the last line" if unsaid else ""
                log.warning(
                    "consumer %s partition %d stops before %s and is left to another "
                    "instance: it %s (instance %s%s)",
                    name,
                    partition,
                    where,
                    describe(need),
                    self._who.name,
                    more,
                )
        self._drop([partition])

    def halt_at(self, poison: Poison, claims: Mapping[int, Claim]) -> None:
        """Halt ``poison``'s partition at it (recorded, told to the plugins) and drop it."""
        claim = claims[self.partition_of(poison)]
        who = self._who
        halt_partition(self._db, who.hooks, self._spec.name, who.id, claim, poison, who.name)
        self._drop([claim.partition])

    def partition_of(self, poison: Poison) -> int:
        """``poison``'s partition (looked up when it was read without its partition hash)."""
        if poison.partition is None:
            position = poison.row[POSITION]
            with self._db.read() as conn:
                envelope = self._store.envelopes(conn, [position])[position]
            poison.partition = envelope.partition_hash % self._spec.partitions
        return poison.partition
