"""Rebalance planning: from the membership and ownership rows, what this instance should
release and claim. Pure: every instance computes the same target from the same rows.

Partitioned consumers: the units are the consumer's partitions, the members are the live
instances that run it partitioned. Single-owner consumers: the units are whole
consumers, spread over the live instances that run them single-owner (grouped by
member set); the elected member claims every partition. A single-owner instance applies
nothing of a consumer while a live instance still runs it partitioned, so a rolling
deploy that switches modes never has two owners apply one partition.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import attrs

from messaging._settings import Distribution
from messaging.distribution._assignor import assign
from messaging.distribution._membership import InstanceRow
from messaging.distribution._needs import Need, can_read, describe, reads_of


@attrs.define(frozen=True, kw_only=True)
class Plan:
    """What one instance should do for one consumer."""

    consumer: str
    target: frozenset[int]
    """The partitions assigned to this instance."""
    release: frozenset[int]
    """Partitions this instance owns that are assigned elsewhere."""
    waiting_for: str | None = None
    """Why this instance applies nothing of the consumer, if it does not."""


def _mode(instance: InstanceRow, consumer: str, fingerprint: str) -> str | None:
    """How ``instance`` runs ``consumer`` under the declaration ``fingerprint``, if it does."""
    entry = instance.runs.get(consumer)
    if entry is None or entry.get("fingerprint") != fingerprint:
        return None
    return str(entry.get("distribution"))


def plan(
    me: str,
    live: Sequence[InstanceRow],
    owners: Mapping[str, Mapping[int, str | None]],
    partitions: Mapping[str, int],
    distributions: Mapping[str, Distribution],
    fingerprints: Mapping[str, str],
    needs: Mapping[str, Mapping[int, Need]] | None = None,
    my_reads: Mapping[str, Mapping[str, int]] | None = None,
    recorded: Mapping[str, Mapping[int, Need]] | None = None,
) -> dict[str, Plan]:
    """Plans for the consumers ``me`` runs (``distributions``: consumer → its mode here).

    ``owners`` maps consumer → partition → owning instance id (or None);
    ``partitions`` maps consumer → partition count; ``fingerprints`` maps consumer → the
    declaration ``me`` runs. Only instances on the same declaration share a consumer.
    ``needs`` maps consumer → partition → the (type, version) its next message needs
    (``messaging.distribution._needs``): such a partition goes only to a member that can
    read it (``my_reads``: what ``me`` reads of each consumer), to none if none can; a
    single-owner consumer with such a partition is elected to a member that can read it.
    ``recorded`` maps consumer → partition → a need its row records, passed or not: while
    members read every need recorded for a consumer, its partitions go only to them (its
    stream carries payloads the others cannot read: any partition may meet one next).
    """
    members = {i.id for i in live} | {me}
    # Every instance reading the same rows ranks the consumers alike: the rank turns the
    # assignor's tie-break, so that remainders spread over the members (see the assignor).
    every_consumer = sorted({c for i in live for c in i.runs} | set(distributions))
    rank = {consumer: k for k, consumer in enumerate(every_consumer)}
    plans: dict[str, Plan] = {}
    single_owner: dict[str, list[str]] = {}
    for consumer, distribution in distributions.items():
        partitioned = sorted(
            i.id
            for i in live
            if _mode(i, consumer, fingerprints[consumer]) == Distribution.PARTITIONED.value
        )
        owned_here = {p for p, o in owners.get(consumer, {}).items() if o == me}
        if distribution is Distribution.PARTITIONED:
            members_here = sorted(set(partitioned) | {me})
            units = range(partitions[consumer])
            current = {p: o for p, o in owners.get(consumer, {}).items() if o in members}
            rotation = rank[consumer] * (len(units) % len(members_here))
            waiting = (needs or {}).get(consumer, {})
            reads = _reads(me, live, my_reads, consumer)
            # Its stream carries payloads some members cannot read: the others take it all.
            seen = {*(recorded or {}).get(consumer, {}).values(), *waiting.values()}
            able_all = [m for m in members_here if all(can_read(reads.get(m, {}), n) for n in seen)]
            assignees = able_all if seen and able_all else members_here
            free = [p for p in units if p not in waiting]
            keep = {p: o for p, o in current.items() if o in assignees}
            target = assign(free, assignees, keep, rotation=rotation)
            for p, need in sorted(waiting.items()):
                able = [m for m in members_here if can_read(reads.get(m, {}), need)]
                if able:
                    holder = current.get(p)
                    target[p] = holder if holder in able and holder else able[p % len(able)]
            mine = frozenset(p for p, owner in target.items() if owner == me)
            plans[consumer] = Plan(
                consumer=consumer, target=mine, release=frozenset(owned_here - mine)
            )
            continue
        others_partitioned = [i for i in partitioned if i != me]
        if others_partitioned:
            plans[consumer] = Plan(
                consumer=consumer,
                target=frozenset(),
                release=frozenset(owned_here),
                waiting_for=f"instances {others_partitioned} still run it partitioned",
            )
            continue
        single_owner[consumer] = sorted(
            i.id
            for i in live
            if _mode(i, consumer, fingerprints[consumer]) == Distribution.SINGLE_OWNER.value
        )
        if me not in single_owner[consumer]:
            single_owner[consumer] = sorted([*single_owner[consumer], me])
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for consumer, runners in single_owner.items():
        groups[tuple(runners)].append(consumer)
    for group_members, consumers in groups.items():
        holders: dict[str, str | None] = {}
        for consumer in consumers:
            held = Counter(o for o in owners.get(consumer, {}).values() if o in members)
            holders[consumer] = min(held, key=lambda o: (-held[o], o)) if held else None
        elected = assign(consumers, group_members, holders)
        for consumer in consumers:
            waiting = (needs or {}).get(consumer, {})
            if waiting:  # to a member that can read what its partitions need, if one can
                reads = _reads(me, live, my_reads, consumer)
                able = [
                    m
                    for m in group_members
                    if all(can_read(reads.get(m, {}), n) for n in waiting.values())
                ]
                if able and elected[consumer] not in able:
                    elected[consumer] = able[rank[consumer] % len(able)]
            owned_here = {p for p, o in owners.get(consumer, {}).items() if o == me}
            if elected[consumer] == me:
                # but a partition waiting for a newer declaration than this one's: it waits,
                # and so does the consumer (applied whole, in global order)
                readable_here = (my_reads or {}).get(consumer, {})
                unreadable = {
                    p: need for p, need in waiting.items() if not can_read(readable_here, need)
                }
                plans[consumer] = Plan(
                    consumer=consumer,
                    target=frozenset(range(partitions[consumer])) - set(unreadable),
                    release=frozenset(owned_here & set(unreadable)),
                    waiting_for=_unreadable(unreadable),
                )
            else:
                plans[consumer] = Plan(
                    consumer=consumer, target=frozenset(), release=frozenset(owned_here)
                )
    return plans


def _reads(
    me: str,
    live: Sequence[InstanceRow],
    my_reads: Mapping[str, Mapping[str, int]] | None,
    consumer: str,
) -> dict[str, Mapping[str, int]]:
    """What each member reads of ``consumer``: published by the others, known here for ``me``."""
    reads = {i.id: reads_of(i, consumer) for i in live}
    reads[me] = (my_reads or {}).get(consumer, {})
    return reads


def _unreadable(unreadable: Mapping[int, Need]) -> str | None:
    """Why a single-owner consumer's elected instance applies nothing: a partition waits
    for a newer declaration than any of its members has."""
    if not unreadable:
        return None
    partition, need = min(unreadable.items())
    return f"its partition {partition} {describe(need)}, which no instance running it has"
