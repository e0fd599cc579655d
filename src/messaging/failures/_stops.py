"""Where a worker stops at a message: a poison message (or one whose handler outlasted the
apply timeout) parks its source or halts its partition there; a payload newer than this
code leaves the partition to an instance that can read it."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from messaging._errors import UnknownPayloadVersion
from messaging.applying._batch import Batch
from messaging.distribution._needs import describe, leave
from messaging.distribution._ownership import Claim
from messaging.failures._poison import Poison, halt_partition, isolate
from messaging.store._rows import POSITION, StoredRow

if TYPE_CHECKING:
    from messaging.applying._worker import ConsumerWorker

log = logging.getLogger("messaging.runtime.worker")


def stop_at(
    worker: ConsumerWorker,
    batch: Batch,
    replay: Sequence[StoredRow],
    poison: Poison,
    started: float,
) -> int:
    """After ``poison`` failed the ``replay`` of ``batch``: park its source (``on-failure:
    park-source``), or commit what came before it, so that its partition's checkpoint stops
    right before it, and halt that partition there (or leave it). Returns how many
    messages were committed."""
    from messaging.applying._parked_apply import park_sources  # (it imports this module)

    done = park_sources(worker, batch, replay, poison, started)
    if done is not None:
        return done
    claims = batch.claims
    found = isolate(poison, partial(worker._commit_prefix, claims, started))
    if isinstance(found.poison.error, UnknownPayloadVersion):
        leave_at(worker, found.poison, claims)  # to an instance that can read it
    else:
        halt_at(worker, found.poison, claims)
    return found.committed


def leave_at(worker: ConsumerWorker, poison: Poison, claims: Mapping[int, Claim]) -> None:
    """Stop before ``poison``, a payload newer than this code: record what its partition
    needs, release it to an instance that can read it (``distribution._needs``), say
    why once."""
    error = poison.error
    assert isinstance(error, UnknownPayloadVersion)
    if error.position is None:  # a newer saga state read for the message: stop before it
        error = UnknownPayloadVersion(error.type_name, error.version, position=poison.row[POSITION])
    leave_partition(worker, claims[partition_of(worker, poison)], error)


def leave_partition(
    worker: ConsumerWorker,
    claim: Claim,
    error: UnknownPayloadVersion,
    deadline: str | None = None,
) -> None:
    """Release ``claim``'s partition to an instance that can read what ``error`` names (at
    a message's position, or a saga's ``deadline``), recording what it needs; say why."""
    where = f"position {error.position}" if deadline is None else deadline
    if leave(worker.db, worker.spec.name, claim, worker.instance_id, error, deadline):
        worker.left[claim.partition] = ((error.type_name, error.version), time.monotonic())
        if (claim.partition, where) not in worker.said:  # left again after a re-claim
            worker.said.add((claim.partition, where))
            log.warning(
                "consumer %s partition %d stops before %s and is left to another instance: "
                "it %s (instance %s)",
                worker.spec.name,
                claim.partition,
                where,
                describe((error.type_name, error.version)),
                worker.instance_name,
            )
    worker.drop([claim.partition])


def partition_of(worker: ConsumerWorker, poison: Poison) -> int:
    if poison.partition is None:  # read without its partition hash: look it up
        position = poison.row[POSITION]
        with worker.db.read() as conn:
            envelope = worker.store.envelopes(conn, [position])[position]
        poison.partition = envelope.partition_hash % worker.spec.partitions
    return poison.partition


def halt_at(worker: ConsumerWorker, poison: Poison, claims: Mapping[int, Claim]) -> None:
    """Halt ``poison``'s partition at it (recorded, told to the plugins) and drop it."""
    claim = claims[partition_of(worker, poison)]
    halt_partition(
        worker.db,
        worker.hooks,
        worker.spec.name,
        worker.instance_id,
        claim,
        poison,
        worker.instance_name,
    )
    worker.drop([claim.partition])
