"""Payloads newer than this code: a partition is left to an instance that can read them.

During a rolling deploy a newer instance writes a (type, version) the older ones do not
know. An older worker meeting one neither applies it, skips it, nor halts: it commits
what came before it, records on the partition row what the message needs (its type,
version and position; fenced by the claim) and releases the partition, saying once why.
Every instance publishes, per consumer, the newest version of each stored type it can
read (``runs[consumer]["reads"]`` of its instance row); the rebalance plan gives such a
partition only to an instance that can read what it needs, and to none while no live
instance can (it waits, and the reports show why). Once its checkpoint passed that
position the record no longer holds the partition back; but while live instances read
every payload recorded for a consumer, the plan gives all its partitions to them alone
(its stream carries newer payloads and more will likely come to any partition: handing
one to older code would move it again at the next one). A saga's deadline has no
position: its record goes when an instance that reads it delivers the partition's due
deadlines.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping

from sqlalchemy import Connection

from messaging._consumers import PAYLOAD_READS_ATTRIBUTE, PAYLOAD_UPCASTS_ATTRIBUTE, ConsumerSpec
from messaging._errors import UnknownPayloadVersion
from messaging._messages import MessageRegistry
from messaging.distribution._membership import InstanceRow
from messaging.distribution._ownership import Claim, Ownership, PartitionRow
from messaging.distribution._pulse import bump_generation
from messaging.store._database import Database

log = logging.getLogger("messaging.distribution.needs")

Need = tuple[str, int]
"""A (type, payload version) a partition's next message needs."""


def readable(registry: MessageRegistry, spec: ConsumerSpec) -> dict[str, int]:
    """The newest payload version of each stored type name ``spec`` reads, with this code."""
    found: dict[str, int] = dict(spec.cls.__dict__.get(PAYLOAD_READS_ATTRIBUTE, {}))
    for cls in spec.handlers:
        for stored, versions in registry.readers_of(registry.type_name(cls)).items():
            found[stored] = max(versions)
    return found


def upcasts(registry: MessageRegistry, spec: ConsumerSpec) -> list[str]:
    """The upcasters and renames ``spec`` reads older payloads through, with this code (for
    the operator: published beside :func:`readable`)."""
    found = {
        label for cls in spec.handlers for label in registry.upcasts_to(registry.type_name(cls))
    }
    own = spec.cls.__dict__.get(PAYLOAD_UPCASTS_ATTRIBUTE)  # a kind's own (a saga's state)
    return sorted(found | set(own() if own is not None else ()))


def published(registry: MessageRegistry, spec: ConsumerSpec) -> dict[str, object]:
    """What an instance publishes of the shapes ``spec`` reads, beside its mode: ``reads``
    (:func:`readable`) and ``upcasters`` (:func:`upcasts`)."""
    return {"reads": readable(registry, spec), "upcasters": upcasts(registry, spec)}


def describe(need: Need) -> str:
    """Why a partition waits for another instance, as logs and reports say it."""
    return f"needs a newer declaration of type {need[0]!r} version {need[1]}"


def leave(
    db: Database,
    consumer: str,
    claim: Claim,
    instance_id: str,
    error: UnknownPayloadVersion,
    deadline: str | None = None,
) -> bool:
    """Record what ``claim``'s partition needs and release it, telling the peers at once
    (fenced by the claim: False if it is no longer held). For a saga's ``deadline`` the
    record holds until an instance that can read it delivers it (:func:`clear_deadline`)."""
    needs = {"type": error.type_name, "version": error.version, "position": error.position}
    if deadline is not None:
        needs = {DEADLINE: deadline, **needs}
    with db.transaction() as conn:
        left = Ownership(db).fenced_update(
            conn, consumer, claim, instance_id, needs=json.dumps(needs), owner=None
        )
        if left:
            bump_generation(db, conn)
        return left


DEADLINE = "deadline"
"""The key of a record of what a saga's deadline (not a message) needs; it comes first."""


def clear_deadline(
    db: Database, conn: Connection, consumer: str, instance_id: str, partitions: Iterable[int]
) -> None:
    """In a delivery's transaction: forget what a deadline of ``partitions`` (owned by
    ``instance_id``) needed, now that this instance, which reads it, delivers them."""
    Ownership(db).clear_needs(conn, consumer, instance_id, partitions, DEADLINE)


def pending(rows: Iterable[PartitionRow]) -> dict[str, dict[int, Need]]:
    """Per consumer, the partitions whose checkpoint is still before a message they need a
    newer declaration for, and what they need."""
    found: dict[str, dict[int, Need]] = {}
    for row in rows:
        need = pending_need(row.needs, row.checkpoint)
        if need is not None:
            found.setdefault(row.consumer, {})[row.partition] = need
    return found


def recorded(rows: Iterable[PartitionRow]) -> dict[str, dict[int, Need]]:
    """Per consumer, the partitions whose row records a need, passed or not: their stream
    holds payloads that older code cannot read, and will likely hold more (the plan keeps
    them with members that read them, so that mixed code does not hand them back and
    forth at each new one)."""
    found: dict[str, dict[int, Need]] = {}
    for row in rows:
        if row.needs is not None:
            record = json.loads(row.needs)
            found.setdefault(row.consumer, {})[row.partition] = (record["type"], record["version"])
    return found


def pending_need(needs: str | None, checkpoint: int) -> Need | None:
    """What a partition at ``checkpoint`` whose row records ``needs`` waits for, if it still
    does (its checkpoint is before the message that needs it)."""
    if needs is None:
        return None
    recorded = json.loads(needs)
    position = recorded.get("position")
    if position is not None and checkpoint >= position:
        return None
    return recorded["type"], recorded["version"]


def reads_of(instance: InstanceRow, consumer: str) -> Mapping[str, int]:
    """What ``instance`` publishes it can read of ``consumer`` (or of its base name, for a
    version ``NAME@N``); nothing for an instance from before payload versions."""
    entry = instance.runs.get(consumer) or instance.runs.get(consumer.split("@")[0]) or {}
    reads = entry.get("reads")
    return reads if isinstance(reads, dict) else {}


def can_read(reads: Mapping[str, int], need: Need) -> bool:
    """Whether an instance reading ``reads`` has the declaration ``need`` needs."""
    return reads.get(need[0], 0) >= need[1]
