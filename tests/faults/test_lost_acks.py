"""Lost COMMIT acknowledgements, one at a time, on demand: the proxy lets a COMMIT reach
MariaDB and commit, then cuts the connection before its answer reaches the framework.
Each test compares the effects with the sequential model: everything once, in order.

(MariaDB only: SQLite cannot lose an acknowledgement, see ``tests/faults/conftest.py``.)
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import fault_app
import pytest
from ack_proxy import AckProxy, TransactionFilter
from clusters import cli, wait_until, write_config
from fault_model import append_numbered, effects, message_ids, tally
from sqlalchemy import func, select, update
from sqlalchemy.exc import DBAPIError

from messaging import (
    Database,
    Instance,
    MessageStore,
    Settings,
    create_plugin_manager,
    hookimpl,
)
from messaging._consumers import consumer_spec
from messaging._messages import registry
from messaging._settings import ConflictRetrySettings, Distribution
from messaging._states import DeclarationOutcome
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._ownership import Ownership
from messaging.store._retry import retry_transient
from messaging.store._rows import partition_of
from messaging.versions._declarations import declare
from messaging.versions._versions import unit_rows
from projections import _operations as operations
from projections._removal import remove

pytestmark = [pytest.mark.faults, pytest.mark.mysql]
STALE = 30.0


def touches(*fragments: str) -> TransactionFilter:
    """Transactions with a statement containing every one of ``fragments``."""
    return lambda statements: any(all(f in s for f in fragments) for s in statements)


CHECKPOINT = touches("consumer_partitions", "checkpoint=CASE")
"""A batch's commit: it moves checkpoints."""


def _instance(db: Database, instance_id: str) -> None:
    with db.transaction() as conn:
        Membership(db).register(
            conn, InstanceInfo(id=instance_id, name=instance_id, host="fault-host", pid=1)
        )


def _worker(
    db: Database,
    proxied: Database,
    cls: type,
    instance_id: str = "fault-1",
    *,
    lanes: int = 1,
    batch_size: int = 500,
) -> Any:
    """A worker of ``cls`` talking through the proxy, holding every partition."""
    _instance(db, instance_id)
    spec = consumer_spec(cls)
    settings = attrs.evolve(Settings().messaging.consumer, batch_size=batch_size)
    worker = (spec.options.worker or spec.kind.worker or ConsumerWorker)(
        db=proxied,
        spec=spec,
        instance_id=instance_id,
        instance_name=instance_id,
        settings=settings,
        hooks=create_plugin_manager([], load_entrypoints=False).hook,
        registry=registry,
        lanes=lanes,
    )
    ownership = Ownership(db)
    with db.transaction() as conn:
        ownership.ensure_partitions(conn, spec.name, spec.partitions)
        claims = ownership.claim(
            conn, spec.name, range(spec.partitions), instance_id, Membership(db).live_ids(STALE)
        )
    worker.add_claims(claims)
    return worker


def _drive(worker: Any, done: Callable[[], bool], what: str) -> None:
    """Poll like the worker's loop does (an error is logged, then polling goes on)."""
    _drive_all([worker], done, what)


def _drive_all(workers: list[Any], done: Callable[[], bool], what: str) -> None:
    """:func:`_drive` for several workers, polled in turn."""

    def step() -> bool:
        for worker in workers:
            try:
                worker.poll()
            except Exception:
                logging.getLogger(__name__).exception("poll failed")
        return done()

    wait_until(step, timeout=30, what=what)


def _checkpoints(db: Database, consumer: str) -> int:
    with db.read() as conn:
        return sum(r.checkpoint for r in Ownership(db).partitions(conn, [consumer]))


def _claims_match_the_database(db: Database, worker: Any) -> bool:
    with db.read() as conn:
        stored = Ownership(db).owned(conn, worker.spec.name, worker.instance_id, worker.claims())
    return bool(stored == worker.claims())


@pytest.mark.parametrize("silent", [False, True], ids=["cut", "silent"])
def test_projection_batch_whose_ack_is_lost_is_applied_once(
    db: Database, proxied: Database, proxy: AckProxy, silent: bool
) -> None:
    """Cut: the connection is closed after the COMMIT. Silent: it stays open and the answer
    never comes; the worker gives up after the answer bound, with the same outcome."""
    proxy.silent = silent
    proxied.bound_answers(1.0)
    worker = _worker(db, proxied, fault_app.SingleSequence)
    sources = [f"s{i}" for i in range(6)]
    append_numbered(db, sources, 1, 5)
    proxy.arm(1, when=CHECKPOINT)
    _drive(worker, lambda: proxy.armed == 0 and _checkpoints(db, "fault-seq-single") > 0, "a batch")
    append_numbered(db, sources, 6, 5)
    _drive(worker, lambda: tally(db, "fault-seq-single", {}).applied >= 60, "the rest")
    result = tally(db, "fault-seq-single", dict.fromkeys(sources, 10))
    assert proxy.dropped == 1
    assert result.exact, result
    assert result.applied == 60
    assert _claims_match_the_database(db, worker)


def test_prefix_and_halt_whose_acks_are_lost_apply_the_prefix_once(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """A poison message: the prefix before it commits (ack lost), then the halt (ack lost).
    The messages before the poison are applied once, the partition ends halted at the
    poison, and the worker no longer holds it."""
    worker = _worker(db, proxied, fault_app.SingleSequence)
    append_numbered(db, ["p"], 1, 3)
    with db.transaction() as conn:
        MessageStore(db).append(conn, fault_app.TOPIC, "p", [fault_app.Numbered("p", -1)])
    partition = partition_of("p", worker.spec.partitions)
    proxy.arm(2, when=lambda st: CHECKPOINT(st) or touches("SET status", "halted")(st))
    _drive(worker, lambda: partition not in worker.claims(), "the partition to halt")
    assert proxy.dropped == 2
    assert tally(db, "fault-seq-single", {"p": 3}).exact
    with db.read() as conn:
        (row,) = [r for r in Ownership(db).partitions(conn) if r.partition == partition]
    assert (row.status, row.checkpoint, row.halted_position) == ("halted", 3, 4)


@pytest.mark.parametrize(("lanes", "batch_size"), [(3, 500), (1, 4)], ids=["lanes", "catching-up"])
def test_lanes_and_catching_up_apply_each_message_once_and_send_each_message_once(
    db: Database, proxied: Database, proxy: AckProxy, lanes: int, batch_size: int
) -> None:
    """Lost acks on the lanes' parallel commits, or on batches read inside the apply
    transaction: every message applied once, in order; each sent message stored once."""
    worker = _worker(db, proxied, fault_app.Sequence, lanes=lanes, batch_size=batch_size)
    sources = [f"s{i}" for i in range(8)]
    append_numbered(db, sources, 1, 10)
    proxy.arm(3, when=CHECKPOINT)
    _drive(worker, lambda: tally(db, "fault-seq", {}).applied >= 80, "every message")
    result = tally(db, "fault-seq", dict.fromkeys(sources, 10))
    assert proxy.dropped == 3
    assert result.exact and result.applied == 80, result
    for destination in (fault_app.GUARDED, fault_app.PLAIN):
        sent = message_ids(db, destination)
        assert len(sent) == 16 and set(sent.values()) == {1}, sent
    assert _claims_match_the_database(db, worker)


@pytest.mark.parametrize("consumer", [fault_app.GuardedJobs, fault_app.PlainJobs])
def test_route_consumer_effects_once_per_id(
    db: Database, proxied: Database, proxy: AckProxy, consumer: type
) -> None:
    """Guarded or not, a route consumer's database effects happen once per message id
    (the guarded one also skips an id sent twice)."""
    worker = _worker(db, proxied, consumer)
    store = MessageStore(db)
    jobs = [f"job-{i}" for i in range(12)]
    with db.transaction() as conn:
        for job in jobs:
            store.send(conn, worker.spec.name, fault_app.Job(job), message_id=job)
    proxy.arm(1, when=CHECKPOINT)
    _drive(
        worker,
        lambda: proxy.armed == 0 and sum(effects(db, worker.spec.name).values()) >= 12,
        "jobs",
    )
    with db.transaction() as conn:
        store.send(conn, worker.spec.name, fault_app.Job("late"), message_id="late")
    proxy.arm(1, when=CHECKPOINT)
    _drive(worker, lambda: "late" in effects(db, worker.spec.name), "a later job")
    assert proxy.dropped == 2
    assert effects(db, worker.spec.name) == Counter([*jobs, "late"])


def test_saga_deadlines_each_delivered_once(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """A deadline delivery whose acknowledgement is lost is not delivered again: its retry
    reads the due deadlines afresh, and the delivered ones are gone."""
    worker = _worker(db, proxied, fault_app.Timers)
    store = MessageStore(db)
    timers = [f"t{i}" for i in range(10)]
    with db.transaction() as conn:
        for timer in timers:
            store.append(
                conn, fault_app.TIMERS, timer, [fault_app.TimerSet(timer, time.time() + 1)]
            )
    proxy.arm(1, when=CHECKPOINT)  # the messages' batch: it schedules the deadlines
    _drive(worker, lambda: proxy.armed == 0 and _deadlines(db) == 10, "deadlines scheduled")
    proxy.arm(1, when=touches("DELETE FROM", "deadlines"))  # their delivery
    _drive(worker, lambda: proxy.armed == 0 and _deadlines(db) == 0, "deadlines delivered")
    assert proxy.dropped == 2
    assert effects(db, "fault-timers") == Counter(timers)
    fired = message_ids(db, fault_app.FIRED)
    assert len(fired) == 10 and set(fired.values()) == {1}


def _deadlines(db: Database) -> int:
    d = db.schema.deadlines
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(d)).scalar_one())


def test_registration_claim_and_release_whose_acks_are_lost(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """An instance whose registration, claims and final release lose their acks starts,
    holds exactly what the database says it holds, applies once, and stops cleanly."""
    manager = create_plugin_manager([], load_entrypoints=False)
    spec = consumer_spec(fault_app.SingleSequence)
    instance = Instance(proxied, [spec], Settings(), manager.hook, name="acks")
    sources = ["a", "b", "c"]
    append_numbered(db, sources, 1, 4)
    registering, claiming = touches("INSERT INTO", "instances"), touches("SET owner", "epoch")
    proxy.arm(2, when=lambda statements: registering(statements) or claiming(statements))
    instance.start(loops=False)  # registers, declares, claims
    assert proxy.armed == 0
    worker = instance.workers[spec.name]
    assert len(worker.claims()) == spec.partitions
    assert _claims_match_the_database(db, worker)
    _drive(worker, lambda: tally(db, spec.name, {}).applied >= 12, "messages")
    proxy.arm(1, when=touches("SET owner=NULL"))
    instance.stop()
    assert proxy.dropped == 3
    assert tally(db, spec.name, dict.fromkeys(sources, 4)).exact
    with db.read() as conn:
        rows = Ownership(db).partitions(conn, [spec.name])
        left = conn.execute(select(func.count()).select_from(db.schema.instances)).scalar_one()
    assert {r.owner for r in rows} == {None} and left == 0


def _halt(db: Database, consumer: str, position: int) -> None:
    t = db.schema.partitions
    with db.transaction() as conn:
        conn.execute(
            update(t)
            .where(t.c.tenant == db.tenant, t.c.consumer == consumer, t.c.partition_no == 0)
            .values(status="halted", halted_position=position, halted_type="x", error="boom")
        )


def test_resume_skipping_poison_whose_ack_is_lost_skips_one_message(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """The retry of ``resume --skip-poison`` after a lost ack finds its audit entry and
    skips nothing more, though the partition halted again at the next poison message
    before the retry (a blind retry would skip that one too)."""
    spec = consumer_spec(fault_app.SingleSequence)
    declare(db, spec, Distribution.PARTITIONED, "ops", instance_name="ops")
    _halt(db, spec.name, 7)
    proxy.arm(1, when=touches("audit", "resume --skip-poison"))
    proxy.on_drop = lambda: _halt(db, spec.name, 9)
    skipped = operations.resume(proxied, spec.name, who="ops", skip_poison=True)
    assert proxy.dropped == 1
    assert [entry["position"] for entry in skipped] == [7]
    with db.read() as conn:
        (row,) = [r for r in Ownership(db).partitions(conn, [spec.name]) if r.partition == 0]
    assert (row.status, row.checkpoint, row.halted_position) == ("halted", 7, 9)
    assert [e["command"] for e in operations.audit_log(db, spec.name)] == ["resume --skip-poison"]


def test_rebuild_whose_ack_is_lost_is_requested_once(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """A rebuild request retried after a lost ack does not fail as 'already being rebuilt':
    it finds its audit entry. The live version is not fenced (it goes on applying)."""
    spec = consumer_spec(fault_app.SingleSequence)
    declare(db, spec, Distribution.PARTITIONED, "ops", instance_name="ops")
    proxy.arm(1, when=touches("audit", "rebuild"))
    operations.rebuild(proxied, spec.name, who="ops")
    assert proxy.dropped == 1
    assert [e["command"] for e in operations.audit_log(db, spec.name)] == ["rebuild"]
    with db.read() as conn:
        epochs = {r.epoch for r in Ownership(db).partitions(conn, [spec.name])}
        (state,) = [u.state for u in unit_rows(db, conn, [spec.name])]
    assert (epochs, state) == ({0}, "rebuild-requested")


def test_cli_append_whose_acks_are_lost_stores_each_line_once(
    db: Database, proxied: Database, proxy: AckProxy, tmp_path: Path
) -> None:
    """``projections append`` (a real process, through the proxy) retries a batch whose
    acknowledgement was lost with the same expected versions: the VersionConflict proves
    the first attempt committed, and no line is stored twice."""
    lines = [
        json.dumps(
            {"topic": fault_app.TOPIC, "source": f"s{n % 3}", "type": "x", "payload": {"n": n}}
        )
        for n in range(20)
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = write_config(tmp_path / "config.yaml", proxied)
    proxy.arm(2, when=touches("INSERT INTO", "messages"))
    out = cli(config, "append", str(tmp_path / "in.jsonl"), "--batch-size", "5")
    assert proxy.dropped == 2
    assert out.splitlines()[0] == "appended 20 messages"
    m = db.schema.messages
    with db.read() as conn:
        stored = conn.execute(
            select(m.c.source, m.c.version, m.c.payload).where(m.c.topic == fault_app.TOPIC)
        ).all()
    assert sorted(json.loads(p)["n"] for _, _, p in stored) == list(range(20))
    assert len(message_ids(db, fault_app.TOPIC)) == 20


def test_an_applications_append_whose_ack_is_lost_is_stored_once(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """``MessageStore.append_committed``, the application's own append (expected versions
    as a web request would give them): two acknowledgements lost, each append stored once,
    at the positions its token names, and a later append's expected version still holds."""
    store = MessageStore(proxied)
    proxy.arm(2, when=touches("INSERT INTO", "messages"))
    appended = [
        store.append_committed(
            fault_app.TOPIC, "order-1", [fault_app.Numbered("order-1", n)], expected_version=n
        )
        for n in range(4)
    ]
    assert proxy.dropped == 2
    m = db.schema.messages
    with db.read() as conn:
        stored = conn.execute(
            select(m.c.position, m.c.version, m.c.payload).where(m.c.source == "order-1")
        ).all()
    assert [(v, json.loads(p)["seq"]) for _, v, p in sorted(stored)] == [
        (1, 0),
        (2, 1),
        (3, 2),
        (4, 3),
    ]
    assert [a for one in appended for a in one] == sorted(p for p, _, _ in stored)
    assert all(a.token.marks for a in appended)


def _declared(db: Database, cls: type) -> str:
    spec = consumer_spec(cls)
    declare(db, spec, Distribution.PARTITIONED, "ops", instance_name="ops")
    return spec.name


def _epochs(db: Database, consumer: str) -> set[int]:
    with db.read() as conn:
        return {r.epoch for r in Ownership(db).partitions(conn, [consumer])}


def test_pause_and_resume_whose_acks_are_lost_are_applied_once(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """A retried pause does not fail as 'already paused', a retried resume not as 'running
    and has no halted partition': each finds its audit entry, and fences once."""
    name = _declared(db, fault_app.SingleSequence)
    proxy.arm(1, when=touches("audit", "'pause'"))
    operations.pause(proxied, name, who="ops")
    assert proxy.dropped == 1
    assert _epochs(db, name) == {1}, "fenced once"
    proxy.arm(1, when=touches("audit", "'resume'"))
    assert operations.resume(proxied, name, who="ops") == []
    assert proxy.dropped == 2
    assert _epochs(db, name) == {2}, "fenced once"
    assert [e["command"] for e in operations.audit_log(db, name)] == ["pause", "resume"]
    with db.read() as conn:
        state = conn.execute(
            select(db.schema.consumers.c.state).where(db.schema.consumers.c.name == name)
        ).scalar_one()
    assert state == "running"


def _three_jobs_handled(db: Database) -> Any:
    """The idempotent route consumer's worker, once it handled three jobs (their ids
    recorded)."""
    _declared(db, fault_app.GuardedJobs)
    worker = _worker(db, db, fault_app.GuardedJobs)
    store = MessageStore(db)
    with db.transaction() as conn:
        for job in ("a", "b", "c"):
            store.send(conn, worker.spec.name, fault_app.Job(job), message_id=job)
    _drive(worker, lambda: len(effects(db, worker.spec.name)) == 3, "jobs")
    return worker


def test_forget_processed_whose_ack_is_lost_returns_what_it_forgot(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """The retry of ``forget-processed`` after a lost ack deletes nothing more and answers
    with the first attempt's count (recorded with its audit entry), not 0."""
    worker = _three_jobs_handled(db)
    proxy.arm(1, when=touches("audit", "'forget-processed'"))
    forgotten = operations.forget_processed(proxied, worker.spec.name, older_than=0, who="ops")
    assert proxy.dropped == 1
    assert forgotten == 3
    assert [e["command"] for e in operations.audit_log(db, worker.spec.name)] == [
        "forget-processed"
    ]


def test_a_remove_whose_ack_is_lost_answers_what_it_deleted_once(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """The retry of ``remove`` after a lost ack deletes nothing more and answers with what
    the first attempt deleted (recorded with its audit entry), not "unknown consumer"."""
    worker = _three_jobs_handled(db)
    proxy.arm(1, when=touches("audit", "'remove'"))
    removed = remove(proxied, worker.spec.name, who="ops")
    assert proxy.dropped == 1
    assert removed["rows"]["processed_messages"] == 3 and removed["rows"]["consumers"] == 1
    assert [e["command"] for e in operations.audit_log(db, worker.spec.name)] == ["remove"]


def test_a_rebuild_whose_version_commits_lose_their_acks_takes_over_once(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """A requested rebuild's commits lose their acks: the one starting the new version, the
    one stopping the live version for the cutover, and the swap. Each rebalance round is
    retried (as the loop does) and finds the step already taken: one version is started,
    it takes over once, and it equals the replay."""
    manager = create_plugin_manager([], load_entrypoints=False)
    spec = consumer_spec(fault_app.SingleSequence)
    instance = Instance(proxied, [spec], Settings(), manager.hook, name="rebuilder")
    append_numbered(db, ["r"], 1, 3)
    instance.start(loops=False)
    _drive(instance.workers[spec.name], lambda: tally(db, spec.name, {}).applied >= 3, "messages")
    operations.rebuild(db, spec.name, who="ops")
    starting = touches("INSERT INTO", "consumers")
    stopping, swapping = touches("SET state='cutting-over'"), touches("SET name=")
    proxy.arm(3, when=lambda sql: starting(sql) or stopping(sql) or swapping(sql))
    unit = f"{spec.name}@2"
    for _ in range(20):
        instance.retry(instance.rebalance, "rebalance")  # as the rebalance loop does
        for worker in list(instance.workers.values()):
            while worker.poll():
                pass
        with db.read() as conn:
            versions = {u.unit: (u.version, u.state) for u in unit_rows(db, conn, [spec.name])}
        if versions.get(spec.name, (1,))[0] == 2 and unit not in instance.workers:
            break
    assert proxy.dropped == 3
    assert versions == {spec.name: (2, "running"), f"{spec.name}@1": (1, "retired")}
    append_numbered(db, ["r"], 4, 2)
    _drive(instance.workers[spec.name], lambda: tally(db, spec.name, {}).applied >= 5, "more")
    assert tally(db, spec.name, {"r": 5}).exact
    instance.stop()


def test_a_release_whose_ack_is_lost_hands_over_once(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """A rebalance round that releases partitions to a joining instance loses that commit's
    ack: the retry releases nothing more; the newcomer claims exactly what was released,
    both workers hold what the database says, and every message is applied once."""
    manager = create_plugin_manager([], load_entrypoints=False)
    spec = consumer_spec(fault_app.Sequence)
    first = Instance(proxied, [spec], Settings(), manager.hook, name="first")
    second = Instance(db, [spec], Settings(), manager.hook, name="second")
    sources = [f"s{i}" for i in range(8)]
    append_numbered(db, sources, 1, 5)
    first.start(loops=False)
    second.start(loops=False)  # waits: the first holds everything
    workers = [first.workers[spec.name], second.workers[spec.name]]
    assert (len(workers[0].claims()), len(workers[1].claims())) == (spec.partitions, 0)
    proxy.arm(1, when=touches("SET owner=NULL"))
    first.retry(first.rebalance, "rebalance")  # as the rebalance loop does
    assert proxy.dropped == 1
    second.retry(second.rebalance, "rebalance")
    held = [set(w.claims()) for w in workers]
    assert held[0] and held[1] and not held[0] & held[1]
    assert held[0] | held[1] == set(range(spec.partitions))
    for worker in workers:
        assert _claims_match_the_database(db, worker)
    append_numbered(db, sources, 6, 5)
    _drive_all(workers, lambda: tally(db, spec.name, {}).applied >= 80, "every message")
    assert tally(db, spec.name, dict.fromkeys(sources, 10)).exact
    for instance in (first, second):
        instance.stop()


class _Released:
    """Records the partitions the plugins are told were released."""

    def __init__(self) -> None:
        self.partitions: list[tuple[str, int]] = []

    @hookimpl
    def projections_partition_released(self, consumer: str, partition: int) -> None:
        self.partitions.append((consumer, partition))


def test_a_stop_whose_ack_is_lost_tells_the_plugins_every_release(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """The stop's release-and-deregister loses its commit's ack: the retry finds nothing
    left to release, yet the plugins hear of every partition the instance let go, once,
    and the database holds no owner and no instance row."""
    released = _Released()
    manager = create_plugin_manager([], load_entrypoints=False)
    manager.register(released)
    spec = consumer_spec(fault_app.Sequence)
    instance = Instance(proxied, [spec], Settings(), manager.hook, name="leaving")
    instance.start(loops=False)
    releases, deletes = touches("SET owner=NULL"), touches("DELETE FROM", "instances")
    proxy.arm(1, when=lambda statements: releases(statements) and deletes(statements))
    instance.stop()
    assert proxy.dropped == 1
    assert sorted(released.partitions) == [(spec.name, p) for p in range(spec.partitions)]
    t = db.schema.partitions
    with db.read() as conn:
        owners = conn.execute(select(t.c.owner).where(t.c.consumer == spec.name)).scalars()
        assert set(owners) == {None}
        assert conn.execute(select(func.count()).select_from(db.schema.instances)).scalar() == 0


def test_heartbeat_and_declaration_whose_acks_are_lost_change_nothing_more(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """A declaration whose ack is lost is found unchanged by its retry (one consumer row,
    partitions at epoch 0); a heartbeat whose ack is lost is stamped again, without
    registering the instance a second time."""
    spec = consumer_spec(fault_app.SingleSequence)
    _instance(db, "declarer")
    proxy.arm(1, when=touches("INSERT INTO", "consumers"))
    declared = retry_transient(
        partial(declare, proxied, spec, Distribution.PARTITIONED, "declarer", "declarer"),
        ConflictRetrySettings(),
        what="declare",
    )
    assert proxy.dropped == 1
    assert declared.outcome == DeclarationOutcome.UNCHANGED  # the retry found its own row
    consumers, instances = db.schema.consumers, db.schema.instances
    with db.read() as conn:
        rows = conn.execute(select(func.count()).select_from(consumers)).scalar_one()
    assert rows == 1
    assert _epochs(db, spec.name) == {0}
    manager = create_plugin_manager([], load_entrypoints=False)
    instance = Instance(proxied, [spec], Settings(), manager.hook, name="beating")
    instance.start(loops=False)
    proxy.arm(1, when=touches("SET heartbeat_at"))
    instance.retry(instance.heartbeat, "heartbeat")  # as the heartbeat loop does
    assert proxy.dropped == 2
    with db.read() as conn:
        names = conn.execute(select(instances.c.name)).scalars().all()
    assert sorted(names) == ["beating", "declarer"]
    assert _claims_match_the_database(db, instance.workers[spec.name])
    instance.stop()


def test_preparing_outlasts_more_lost_acks_in_a_row_than_a_loops_retries(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """An instance's start prepares the database within a one-shot command's retries, not
    a loop's five: under randomly lost acknowledgements of every commit (8 % in
    tests/faults/test_random_acks.py) six lost in a row made a starting instance exit."""
    lost = 8  # more than ConflictRetrySettings().max_retries + 1 attempts
    tenant = Database(proxied.url, tenant="persistent", table_prefix=db.schema.prefix)
    try:
        proxy.arm(lost)
        tenant.prepare()
        assert proxy.dropped == lost
    finally:
        tenant.dispose()


def test_housekeeping_whose_acks_are_lost_changes_nothing_more(
    db: Database, proxied: Database, proxy: AckProxy
) -> None:
    """Preparing a new tenant (its counters), the stale-row purge and forgetting a retired
    consumer each lose their commit's ack: the retry (or the next round) finds the first
    attempt's result and changes nothing more."""
    tenant = Database(proxied.url, tenant="housekeeping", table_prefix=db.schema.prefix)
    try:
        proxy.arm(1, when=touches("INSERT INTO", "positions"))
        tenant.prepare()  # retries errors of unknown outcome itself
        assert proxy.dropped == 1
        p, g = db.schema.positions, db.schema.generations
        with db.read() as conn:
            for table in (p, g):
                rows = conn.execute(select(table).where(table.c.tenant == "housekeeping")).all()
                assert len(rows) == 1, table.name
    finally:
        tenant.dispose()

    _instance(db, "long-dead")
    instances = db.schema.instances
    with db.transaction() as conn:  # its last heartbeat a day ago: past any retention
        conn.execute(update(instances).values(heartbeat_at=instances.c.heartbeat_at - 86_400))
    membership = Membership(proxied)
    proxy.arm(1, when=touches("DELETE FROM", "instances"))
    with pytest.raises(DBAPIError):  # an unreachable database is the caller's outage
        membership.remove_stale_when_due(stale_timeout=1.0)
    assert proxy.dropped == 2
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(instances)).scalar() == 0
    assert Membership(proxied).remove_stale_when_due(stale_timeout=1.0) == 0  # a next round

    manager = create_plugin_manager([], load_entrypoints=False)
    specs = [consumer_spec(fault_app.Sequence), consumer_spec(fault_app.SingleSequence)]
    instance = Instance(proxied, specs, Settings(), manager.hook, name="forgetting")
    instance.start(loops=False)
    proxy.arm(1, when=touches("UPDATE", "instances", "runs"))
    instance.presence.forget("fault-seq-single")
    assert proxy.dropped == 3
    with db.read() as conn:
        runs = conn.execute(select(instances.c.runs).where(instances.c.name == "forgetting"))
        assert set(json.loads(runs.scalar_one())) == {"fault-seq"}
    instance.stop()
