"""Where a worker stops at a message: a poison message halts its partition there; a
payload newer than this code leaves the partition to an instance that can read it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from messaging._errors import UnknownPayloadVersion
from messaging.distribution._needs import describe, leave
from messaging.distribution._ownership import Claim
from messaging.runtime._poison import Poison, halt_partition
from messaging.store._rows import POSITION

if TYPE_CHECKING:
    from messaging.runtime._worker import ConsumerWorker

log = logging.getLogger("messaging.runtime.worker")


def leave_at(worker: ConsumerWorker, poison: Poison, claims: Mapping[int, Claim]) -> None:
    """Stop before ``poison``, a payload newer than this code: record what its partition
    needs, release it to an instance that can read it (``distribution._needs``), say
    why once."""
    claim = claims[partition_of(worker, poison)]
    error = poison.error
    assert isinstance(error, UnknownPayloadVersion)
    if leave(worker.db, worker.spec.name, claim, worker.instance_id, error):
        log.warning(
            "consumer %s partition %d stops before position %s and is left to another "
            "instance: it %s (instance %s)",
            worker.spec.name,
            claim.partition,
            error.position,
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
