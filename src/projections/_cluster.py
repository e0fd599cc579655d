"""The cluster view (``GET /admin/cluster``): the live members, each consumer's shares, the
member that serves the request, and whether that instance applies each consumer and, if
not, why.

The reasons (``here.why``), in the order they are tried: ``not-a-member`` (a supervisor
of ``run --workers`` or ``projections admin`` answers: it applies nothing itself),
``stopping``, ``outage`` (its loops see the database unreachable or refusing writes),
``applies`` (it owns partitions of it), ``paused``, ``not-declared`` (its application
does not declare it), ``older-declaration`` (it runs a declaration the consumer left
behind, or the partitions wait for an instance that reads newer payload versions),
``newer-declaration`` (it builds a new version beside the live one, which the instances
with the live declaration apply), ``waiting`` (its rebalance round said why),
``standby`` (single-owner: another member applies it), ``halted``, ``no-live-member`` and
``owned-elsewhere`` (the other members own every partition, or its share is not claimed
yet).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from messaging import Distribution, Instance
from messaging.operations import ConsumerState, OwnerState, PartitionStatus, split_unit

SINGLE_OWNER_REASON = "single-owner: one elected instance applies it"
NO_LIVE_MEMBER = "no member is live: no instance applies any consumer (start `projections run`)"
NOT_A_MEMBER = (
    "this server is not a member (a supervisor of `run --workers` or `projections admin`): "
    "it applies nothing itself; the members do"
)


@attrs.frozen
class Here:
    """What the instance serving the request runs, as its admin server sees it."""

    id: str
    name: str
    declared: frozenset[str]
    """The transactional consumers its application declares."""
    runs: frozenset[str]
    """Those it runs (a stale declaration is not run)."""
    applies: frozenset[str]
    """The units (``name`` or ``name@N``) it has a worker for."""
    stopping: bool = False
    outage: str | None = None
    waiting: Mapping[str, str] = attrs.field(factory=dict)
    """Why its last rebalance round planned nothing of a unit here, by unit."""

    @classmethod
    def of(cls, instance: Instance) -> Here:
        causes = {instance.outage.cause, instance.heartbeat_outage.cause} - {None}
        return cls(
            id=instance.id,
            name=instance.name,
            declared=frozenset(s.name for s in instance.specs if s.transactional),
            runs=frozenset(instance.declared.running()),
            applies=frozenset(instance.workers),
            stopping=instance.stop_requested.is_set(),
            outage="; ".join(sorted(str(c) for c in causes)) or None,
            waiting=instance.rebalancer.waiting(),
        )


def ranges(numbers: Iterable[int]) -> list[list[int]]:
    """Numbers as sorted contiguous inclusive ranges: ``[0,1,2,5]`` → ``[[0,2],[5,5]]``."""
    result: list[list[int]] = []
    for n in sorted(set(numbers)):
        if result and result[-1][1] == n - 1:
            result[-1][1] = n
        else:
            result.append([n, n])
    return result


def cluster_report(
    consumers: dict[str, Any],
    instances: dict[str, Any],
    answered_by: str,
    here: Here | None = None,
) -> dict[str, Any]:
    """Live members (sorted by id; ``serving`` marks the one answering) and, per consumer,
    each member's share of its partitions and whether ``here`` (the serving instance; None
    for a server that is not a member) applies it (``here``: ``applies``, ``why``,
    ``reason``).

    ``consumers`` and ``instances`` are the two reports of :mod:`projections._reports`.
    A partition counts for a member only while it is OWNED by it; the others are listed
    under ``unowned`` (ORPHANED or UNCLAIMED). ``share`` is the member's count over the
    consumer's partition count (0 when it has none).
    """
    serving_id = here.id if here is not None else None
    members = sorted(
        (
            {
                "id": i["id"],
                "name": i["name"],
                "host": i["host"],
                "pid": i["pid"],
                "serving": i["id"] == serving_id,
            }
            for i in instances["instances"]
            if i["live"]
        ),
        key=lambda m: str(m["id"]),
    )
    result = []
    for consumer in consumers["consumers"]:
        parts = consumer["partitions"]
        total = len(parts)
        owned: dict[str, list[int]] = {m["id"]: [] for m in members}
        unowned: list[int] = []
        for p in parts:
            if p["state"] == OwnerState.OWNED and p.get("instance_id") in owned:
                owned[p["instance_id"]].append(p["partition"])
            else:
                unowned.append(p["partition"])
        partitioned = consumer["distribution"] == Distribution.PARTITIONED.value
        entry: dict[str, Any] = {
            "name": consumer["name"],
            "kind": consumer["kind"],
            "distribution": consumer["distribution"],
            "partitioned": partitioned,
            "partitions": total,
            "shares": [
                {
                    "id": m["id"],
                    "instance": m["name"],
                    "partitions": sorted(owned[m["id"]]),
                    "ranges": ranges(owned[m["id"]]),
                    "share": len(owned[m["id"]]) / total if total else 0.0,
                }
                for m in members
            ],
            "unowned": ranges(unowned),
            "here": applies_here(consumer, members, here),
        }
        if not partitioned:
            entry["reason"] = SINGLE_OWNER_REASON
        result.append(entry)
    report: dict[str, Any] = {
        "answered_by": answered_by,
        "serving": {
            "member": here is not None,
            "id": serving_id,
            "name": here.name if here is not None else None,
            "note": None if here is not None else NOT_A_MEMBER,
        },
        "members": members,
        "consumers": result,
    }
    if not members:
        report["no_live_member"] = NO_LIVE_MEMBER
    return report


def applies_here(
    consumer: dict[str, Any], members: list[dict[str, Any]], here: Here | None
) -> dict[str, Any]:
    """Whether ``here`` applies ``consumer`` (an entry of the consumers report) and, if
    not, why: ``{"applies", "why", "reason"}`` (see the module's docstring)."""
    why, reason = _why(consumer, members, here)
    return {"applies": why == "applies", "why": why, "reason": reason}


def _why(
    consumer: dict[str, Any], members: list[dict[str, Any]], here: Here | None
) -> tuple[str, str]:
    name, parts = consumer["name"], consumer["partitions"]
    base, _ = split_unit(name)
    if here is None:
        return "not-a-member", NOT_A_MEMBER
    if here.stopping:
        return "stopping", "this instance is stopping: it ends its batches and lets go"
    if here.outage is not None:
        return "outage", f"outage: {here.outage}; it applies nothing until that is over"
    mine = [p for p in parts if p["state"] == OwnerState.OWNED and p.get("instance_id") == here.id]
    halted = [p for p in parts if p["status"] == PartitionStatus.HALTED]
    stopped = f"{len(halted)} partition(s) halted at a poison message: nobody applies them "
    stopped += f"until `projections resume {base}` (with --skip-poison to skip it)"
    if len(mine) > len([p for p in mine if p in halted]):
        held = f"; {stopped}" if halted else ""
        return "applies", f"applies {len(mine)} of its {len(parts)} partition(s){held}"
    if mine:
        return "halted", stopped
    if consumer.get("state") == ConsumerState.PAUSED:
        return "paused", f"an operator paused it (`projections resume {base}`)"
    if base not in here.declared:
        return "not-declared", "this instance's application does not declare it"
    if base not in here.runs or (consumer.get("version_of") and name not in here.applies):
        return "older-declaration", (
            "this instance runs an older declaration, which the consumer has left behind: "
            "it applies nothing of it (deploy the new one here)"
        )
    if name not in here.applies:
        return "newer-declaration", (
            "this instance runs a newer declaration: it builds its new version beside this "
            "one, which the instances with the live declaration apply"
        )
    if name in here.waiting:
        return "waiting", here.waiting[name]
    others = [p for p in parts if p["state"] == OwnerState.OWNED]
    if consumer["distribution"] != Distribution.PARTITIONED.value and others:
        return "standby", (
            f"single-owner standby: {others[0]['instance']} applies it; this instance "
            "takes over if that one goes"
        )
    free = [p for p in parts if p["state"] != OwnerState.OWNED]
    if free and all("waiting" in p for p in free):
        return "older-declaration", f"its partitions wait: they {free[0]['waiting']}"
    if any(p in halted for p in free):
        return "halted", stopped
    if not members:
        return "no-live-member", NO_LIVE_MEMBER
    return "owned-elsewhere", (
        "the other members own every partition (more members than partitions)"
        if not free
        else "not claimed here yet: the next rebalance round claims its share"
    )
