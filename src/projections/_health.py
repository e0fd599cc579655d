"""Health verdicts per consumer and partition, from the database alone (any host can ask).

A consumer that none of the live instances declares (the running code dropped it) is
``undeclared``, and so are its partitions: a warning naming ``projections remove``, not
an ``unowned`` alarm (with no live instance at all, the verdicts below apply). Otherwise
a partition is, in this order of precedence: ``paused`` (its consumer is), ``halted`` (at
a poison message), ``rebuilding`` (a version of a projection being built, or a live one
stopped while its new version takes over), ``unowned`` (no live owner for
stale-instance-timeout plus one second: since its release, or since its owner's last
heartbeat; the reason names what its next message needs when no live instance can read
it), ``rebuilding`` (a rebuild requested, not started yet),
``stalled`` (messages to apply and no checkpoint committed for ``health.stall-timeout``),
``parked`` (sources of it parked: their messages wait for an operator), ``lagging``
(messages to apply, progressing) or ``caught-up``. Progress is timed from the
partition row's ``updated_at`` (a claim, a release, an operator's command or an advanced
checkpoint) or from when its oldest message to apply was recorded, whichever is later, so
a partition just claimed, resumed or handed over, or that just got a message, is not
stalled. A consumer's verdict is its partitions' most alarming one; the report's status is
the worst severity (:class:`~messaging._states.Severity`), and at least ``degraded`` while
the database refuses writes (a write that changes nothing is tried:
:func:`~messaging.store._refusals.refused_writes`). A retired version is not reported.
A consumer that a live instance has run a replaced declaration of (it applies nothing of
it: old code after a cutover, or after a rollback) for longer than
``health.stall-timeout`` is at least ``outdated`` (degraded), naming the instance: within
the stall timeout, a rolling deploy's old instances raise no alarm.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select

from messaging import Database, ProjectionsError, Settings, Severity, Verdict
from messaging.operations import (
    ConsumerState,
    InstanceRow,
    Membership,
    OwnerState,
    PartitionStatus,
    format_duration,
    refused_writes,
    stale_of,
    unknown_consumer,
)
from projections._reports import consumers_report

UNOWNED_GRACE = 1.0
"""Seconds past stale-instance-timeout a partition may go without a live owner: the
takeover of a crashed owner's partitions takes at most that long."""
_RANK = list(Verdict)


class UnknownConsumer(ProjectionsError):
    """A health request names a consumer the database does not know."""

    def __init__(self, name: str, known: Iterable[str] = ()) -> None:
        super().__init__(unknown_consumer(name, known))
        self.name = name


def thresholds(settings: Settings) -> dict[str, float]:
    """The thresholds of the verdicts, in seconds."""
    return {
        "stall_timeout": settings.health.stall_timeout,
        "unowned_after": settings.messaging.consumer.stale_instance_timeout + UNOWNED_GRACE,
    }


def health_report(db: Database, settings: Settings, consumer: str | None = None) -> dict[str, Any]:
    """``{"status", "database", "thresholds", "consumers": [{"name", "kind", "version",
    "verdict", "severity", "partitions": [{"partition", "verdict", "severity", "lag",
    "instance", "reason"}]}]}``
    for every consumer, or for ``consumer`` alone (:class:`UnknownConsumer` if none)."""
    stale = settings.messaging.consumer.stale_instance_timeout
    limits = thresholds(settings)
    with db.read() as conn:
        report = consumers_report(db, settings.messaging.consumer, conn, ages=True)
        membership = Membership(db)
        members = membership.instances(conn, stale)
        silent = {r.id: stale - r.expires_in for r in members}
        published_by = membership.in_memory(conn)
        now = float(conn.execute(select(db.clock.now())).scalar_one())
        stuck = {
            (instance_id, batch["consumer"], partition): batch
            for instance_id, published in published_by.items()
            for batch in published.get("stuck", [])
            for partition in batch["partitions"]
        }
    refused = refused_writes(db)
    chosen = [c for c in report["consumers"] if consumer in (None, c["name"])]
    if consumer is not None and not chosen:
        raise UnknownConsumer(consumer, (c["name"] for c in report["consumers"]))
    live = [m for m in members if m.live]
    consumers = []
    for entry in chosen:
        if entry["state"] == ConsumerState.RETIRED:
            continue  # a version a cutover replaced: applied by no one, on purpose
        undeclared = bool(live) and not any(
            m.declares(entry["name"], stale_of(published_by, m.id)) for m in live
        )
        partitions = []
        for p in entry["partitions"]:
            idle, unowned = p["idle"], p["changed"]
            if p["state"] == OwnerState.ORPHANED and p["instance_id"] in silent:
                unowned = silent[p["instance_id"]]  # since its owner's last heartbeat
            elif p["state"] == OwnerState.OWNED:
                unowned = 0.0
            state = ConsumerState.REBUILDING if "build" in entry else entry["state"]
            batch = stuck.get((p["instance_id"], entry["name"], p["partition"]))
            if undeclared:
                verdict, reason = Verdict.UNDECLARED, _undeclared(entry["name"], len(live))
            else:
                verdict, reason = _verdict(state, p, idle, unowned, limits, batch)
            partitions.append(
                {
                    "partition": p["partition"],
                    "verdict": verdict,
                    "severity": verdict.severity,
                    "lag": p["lag"],
                    "instance": p["instance"],
                    "reason": reason,
                }
            )
        worst = max((p["verdict"] for p in partitions), key=_RANK.index, default=Verdict.CAUGHT_UP)
        found: dict[str, Any] = {
            "name": entry["name"],
            "kind": entry["kind"],
            "version": entry["version"],
            "verdict": worst,
            "severity": worst.severity,
            "partitions": partitions,
        }
        outdated = _outdated(entry["name"], live, published_by, now)
        if outdated:
            found["outdated"] = outdated
        if any(o["for"] > limits["stall_timeout"] for o in outdated):
            found["verdict"] = max(worst, Verdict.OUTDATED, key=_RANK.index)
            found["severity"] = found["verdict"].severity
        if entry.get("parked_sources"):  # how many, and the oldest's age in seconds
            found["parked_sources"] = entry["parked_sources"]
            found["parked_age"] = entry["parked_age"]
        consumers.append(found)
    severities = [c["severity"] for c in consumers] + [Severity.HEALTHY]
    if refused is not None:
        severities.append(Severity.DEGRADED)
    return {
        "status": max(severities, key=list(Severity).index),
        "database": "takes writes" if refused is None else f"refuses writes: {refused}",
        "thresholds": limits,
        "consumers": consumers,
    }


def _verdict(
    state: str,
    p: dict[str, Any],
    idle: float,
    unowned: float,
    limits: dict[str, float],
    stuck: dict[str, Any] | None = None,
) -> tuple[Verdict, str]:
    """A partition's verdict and why, in words (``stuck``: the batch its owner says is
    stuck past its apply timeout, if any)."""
    if state == ConsumerState.PAUSED:
        return Verdict.PAUSED, "an operator paused the consumer"
    if p["status"] == PartitionStatus.HALTED:
        halted = p.get("halted") or {}
        still = "" if stuck is None else f"; its handler {_stuck_for(stuck)}"
        return Verdict.HALTED, (
            f"halted at position {halted.get('position')} ({halted.get('type')}): "
            f"{halted.get('error')}{still}"
        )
    if state in (ConsumerState.REBUILDING, ConsumerState.CUTTING_OVER):
        return Verdict.REBUILDING, (
            "a new version of the consumer is built beside the live one"
            if state == ConsumerState.REBUILDING
            else "the consumer's new version is taking over (its live version stopped)"
        )
    if unowned > limits["unowned_after"] and "waiting" in p:
        return Verdict.UNOWNED, (
            f"no live instance can read its next message: it {p['waiting']} (released "
            f"{unowned:.1f} s ago)"
        )
    if unowned > limits["unowned_after"]:
        who = f"its owner {p['instance']} was last heard" if p["instance"] else "released"
        return Verdict.UNOWNED, (
            f"no live owner: {who} {unowned:.1f} s ago (past stale-instance-timeout + "
            f"{format_duration(UNOWNED_GRACE)} = {format_duration(limits['unowned_after'])})"
        )
    if state == ConsumerState.REBUILD_REQUESTED:
        return Verdict.REBUILDING, f"the consumer is {state}"
    if stuck is not None:
        return Verdict.STALLED, f"a batch of its owner {p['instance']} {_stuck_for(stuck)}"
    if p["lag"] and idle > limits["stall_timeout"]:
        return Verdict.STALLED, (
            f"{p['lag']} message(s) to apply and no checkpoint committed for {idle:.1f} s "
            f"(past health.stall-timeout {format_duration(limits['stall_timeout'])})"
        )
    if p.get("parked_sources"):
        return Verdict.PARKED, (
            f"{p['parked_sources']} source(s) parked, the oldest {p['parked_age']:.1f} s ago: "
            "their messages wait for `projections parked` (retry, skip or evict)"
        )
    if p["lag"]:
        return Verdict.LAGGING, f"{p['lag']} message(s) to apply; last progress {idle:.1f} s ago"
    return Verdict.CAUGHT_UP, "nothing to apply"


def _outdated(
    consumer: str, live: list[InstanceRow], published_by: dict[str, Any], now: float
) -> list[dict[str, Any]]:
    """The live instances whose code holds a declaration of ``consumer`` (a live version's
    name) that the database replaced, each with how long: ``[{"instance", "for"}]``."""
    if "@" in consumer:
        return []
    return [
        {"instance": member.name, "for": max(0.0, now - since)}
        for member in live
        if (since := stale_of(published_by, member.id).get(consumer)) is not None
    ]


def _undeclared(consumer: str, live: int) -> str:
    """Why a consumer (or a version of it) no live instance declares is reported so, and
    what to do."""
    name = consumer.partition("@")[0]
    return (
        f"none of the {live} live instance(s) declares it: deploy code that does, or "
        f"remove it (`projections remove {name}`)"
    )


def format_health(report: dict[str, Any]) -> str:
    """The health report as text: the status, then one line per consumer and one per
    partition that is not caught up."""
    limits = report["thresholds"]
    lines = [
        f"{report['status']}  (stall-timeout {format_duration(limits['stall_timeout'])}, "
        f"unowned after {format_duration(limits['unowned_after'])}; the database "
        f"{report['database']})"
    ]
    for consumer in report["consumers"]:
        parked = consumer.get("parked_sources")
        held = (
            f"; {parked} source(s) parked, the oldest {consumer['parked_age']:.0f} s ago"
            if parked
            else ""
        )
        lines.append(
            f"{consumer['name']}  {consumer['verdict']}  ({consumer['severity']}; version "
            f"{consumer['version']}{held})"
        )
        for stale in consumer.get("outdated", []):
            lines.append(
                f"  instance {stale['instance']} runs a declaration of it the database "
                f"replaced, for {stale['for']:.0f} s: it applies nothing of it until it runs "
                f"the current code (or `projections rollback {consumer['name']}` makes its "
                "declaration live again)"
            )
        for p in consumer["partitions"]:
            if p["verdict"] != Verdict.CAUGHT_UP:
                lines.append(f"  partition {p['partition']:>4}  {p['verdict']:<11} {p['reason']}")
    return "\n".join(lines)


def _stuck_for(stuck: dict[str, Any]) -> str:
    """What its owner says of a batch stuck past its apply timeout, in words."""
    return (
        f"is stuck past its apply timeout ({format_duration(stuck['timeout'])}) for "
        f"{stuck['over']:.1f} s in {stuck['where']}"
    )
