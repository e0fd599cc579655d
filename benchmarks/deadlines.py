"""Saga deadline delivery: due deadlines per second, and lateness against the poll interval.

Run as ``python benchmarks/deadlines.py [--mysql-url URL] [--deadlines N] [--runs N]``
(``--help`` for the rest). About 25 s on SQLite, 30 s more with MySQL.

A small benchmark saga (``Timers``) starts one instance per ``TimerSet`` message and
schedules one ``TimerFired`` deadline; delivering it increments a counter in the
saga's state and sends one ``TimerElapsed`` command. Everything goes through the
framework's own code paths: start messages are appended to the store and applied by an
instance, deadlines are delivered by real ``messaging.Instance`` threads
(``DatabaseClock``, sub-second intervals) and observed through the
``projections_deadlines_delivered`` hook. The benchmark waits on a
condition fed by the hooks, never on sleeps.

**Throughput.** ``--deadlines`` (20,000) sagas are started by an instance whose
database has a ``ManualClock`` an hour back, so that their deadlines are stored but
none is due for it. By the real clock they are all overdue: the "deadlines due while
no instance ran" case. A snapshot of the saga and deadline rows is restored before
every run. A framework run's clock starts when a fresh instance has finished its first
rebalance round (partitions claimed, loops not yet started) and stops at the hook call
that brings the delivered count to N. The baseline, in the same run on the same rows,
is the best hand-written ``sqlite3`` (resp. PyMySQL) loop (:class:`HandWritten`): per
batch of the same size (500), one transaction that reads the due rows by the same
``(tenant, saga, partition_no, due_at)`` index, a range per partition, joined with their
sagas' states in the same read, deletes the deadlines in one statement, writes the
states from the version read in one statement (a multi-row upsert on MySQL), inserts
the sent commands as one multi-row ``INSERT``, updates the partitions' rows guarded by
epoch and checkpoint, and commits; every row count is checked. Framework and baseline
runs alternate; the medians are printed with ``ratio framework/hand-written``, then
each pair's ratio and its spread, and each run's CPU µs per deadline (the process's CPU
time from the first round to the last delivery, plus the server threads serving it,
:mod:`costs`) with their ratio and the load average. A saga
is applied in one lane (in position order), like the baseline's single connection.

**Lateness.** With an instance running, ``--lateness-deadlines`` (2,000) sagas are
started, their deadlines spread evenly from 2 s to 2 s + ``--spread`` (3 s) after
their start, so that the starts are applied before the first one is due (the summary
says how long they took). The hook gives each deadline's lateness: the database's time
when its delivery batch read the clock minus its due time. The p50/p95/p99/max over
``--lateness-runs`` (2) runs are printed beside ``idle-poll-interval`` (200 ms,
``--idle-poll-interval``): the issue promises delivery "on time within one poll
interval of the due time under normal load".

**Correctness**, checked after every run of either kind: each deadline was delivered
exactly once (the hook counts N, every saga's counter is 1), each saga sent one command,
and none is left.

SQLite runs on a temporary file; MySQL (``--mysql-url``) in a scratch database created
beside the given one and dropped at the end (or, if it cannot be created, under a
unique table prefix in the given one, dropped too).
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Measure this checkout's code, whichever checkout an editable install points at.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import attrs
from sqlalchemy import delete, distinct, func, insert, inspect, select, text
from sqlalchemy.engine import make_url

import bench_mysql
import messaging
from costs import Costs, Mark, Server, cpu_ratio, load_average, measured, spread
from messaging import Database, Instance, MessageStore, NewMessage, handler, hookimpl, message
from messaging._config import settings_from_mapping
from messaging._consumers import ConsumerSpec
from messaging._messages import registry
from messaging._settings import Settings
from messaging.store._clock import DatabaseClock, ManualClock
from messaging.store._migrations import migrate
from sagas import SagaContext, saga, start

SAGA = "bench-deadlines"
TOPIC = "bench-timers"
ELAPSED = "bench-elapsed"
"""The destination of the commands the deadlines send."""
PARTITIONS = 16
BATCH = 500
TENANT = "default"
APPEND_CHUNK = 5_000
SETUP_CLOCK_OFFSET = 3_600.0
"""How far back the setup instance's manual clock is, in seconds."""
LATENESS_LEAD = 2.0
"""Seconds between a lateness saga's start and its earliest deadline: time enough to
apply the start messages first, so that the deadlines are measured under no other load."""
WAIT_TIMEOUT = 600.0


class BenchmarkFailure(Exception):
    """A deadline delivered twice or never, one left in the table, or a run that stalled."""


# -- the benchmark saga -------------------------------------------------------------------


@message("bench-deadlines.timer-set")
@attrs.define(frozen=True)
class TimerSet:
    timer_id: str
    due_in: float


@message("bench-deadlines.timer-fired")
@attrs.define(frozen=True)
class TimerFired:
    timer_id: str


@message("bench-deadlines.timer-elapsed")
@attrs.define(frozen=True)
class TimerElapsed:
    timer_id: str


@attrs.define
class TimerState:
    fired: int = 0


@saga(SAGA, topics=TOPIC, correlate_by="timer_id", state=TimerState, partitions=PARTITIONS)
class Timers:
    """One instance per timer: schedules its deadline on start, counts its deliveries and
    sends one ``TimerElapsed`` command per delivery (what a timeout usually does)."""

    @start
    def set(self, event: TimerSet, ctx: SagaContext) -> None:
        ctx.state = TimerState()
        ctx.schedule(TimerFired(event.timer_id), after=event.due_in)

    @handler
    def fired(self, event: TimerFired, ctx: SagaContext) -> None:
        ctx.state.fired += 1
        ctx.send(ELAPSED, TimerElapsed(event.timer_id), key=event.timer_id)


# -- the probe: a plugin fed by the instances' hooks ---------------------------------------


class Probe:
    """Counts deliveries and applied messages, collects lateness, wakes the waiter."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.server = Server("sqlite://")
        """The database server of the run (set before each), whose CPU is measured."""
        self.reset()

    def costs(self, count: int) -> Costs:
        """What the run cost from the first round to the last delivery (the server's until
        now, the waiter having seen the last delivery)."""
        if self.ready is None:
            raise BenchmarkFailure("the instance never finished a rebalance round")
        cpu, mark, load = self.ready
        server, whole = self.server.since(mark)
        return Costs(
            own=self.last_cpu - cpu,
            server=server,
            server_whole=whole,
            wall=self.last_delivery_at - (self.ready_at or 0.0),
            load_before=load,
            load_after=load_average(),
            count=count,
        )

    def reset(self) -> None:
        with self.changed:
            self.delivered = 0
            self.applied = 0
            self.lateness: list[float] = []
            self.ready_at: float | None = None
            self.last_delivery_at = 0.0
            self.ready: tuple[float, Mark, float] | None = None
            """At the first round: this process's CPU time, the server's, the load."""
            self.last_cpu = 0.0

    @hookimpl
    def projections_rebalanced(self, instance_id: str) -> None:
        with self.changed:
            if self.ready_at is None:
                self.ready_at = time.perf_counter()
                self.ready = (time.process_time(), self.server.mark(), load_average())

    @hookimpl
    def projections_batch_applied(self, consumer: str, count: int) -> None:
        if consumer != SAGA:
            return
        with self.changed:
            self.applied += count
            self.changed.notify_all()

    @hookimpl
    def projections_deadlines_delivered(
        self, consumer: str, count: int, lateness: Sequence[float]
    ) -> None:
        if consumer != SAGA:
            return
        now = time.perf_counter()
        with self.changed:
            self.delivered += count
            self.lateness.extend(lateness)
            self.last_delivery_at = now
            self.last_cpu = time.process_time()
            self.changed.notify_all()

    def wait(self, done: Callable[[], bool], what: str) -> None:
        """Wait until ``done()`` (checked under the lock); fail after ``WAIT_TIMEOUT``."""
        with self.changed:
            if not self.changed.wait_for(done, timeout=WAIT_TIMEOUT):
                raise BenchmarkFailure(
                    f"timed out waiting for {what} "
                    f"(delivered {self.delivered}, applied {self.applied})"
                )


PROBE = Probe()


def saga_spec() -> tuple[ConsumerSpec, Any]:
    """The Timers saga's spec, collected through the plugin manager, and the hooks."""
    module = sys.modules[__name__]
    manager = messaging.create_plugin_manager([module], plugins=[PROBE], load_entrypoints=False)
    (spec,) = [s for s in messaging.collect_consumers(manager) if s.name == SAGA]
    return spec, manager.hook


def settings(idle_poll_interval: float) -> Settings:
    """Sub-second intervals for one instance; the batch size of the baseline."""
    return settings_from_mapping(
        {
            "messaging": {
                "consumer": {
                    "rebalance-interval": "1s",
                    "stale-instance-timeout": "5s",
                    "heartbeat-interval": "500ms",
                    "graceful-shutdown-timeout": "10s",
                    "idle-poll-interval": f"{idle_poll_interval * 1000:g}ms",
                    "batch-size": BATCH,
                    "conflict-retry": {"max-retries": 5, "max-delay": "100ms"},
                }
            }
        }
    )


# -- rows: starting sagas, snapshots, checks ------------------------------------------------


def append_starts(db: Database, prefix: str, dues: Sequence[float]) -> None:
    """Append one ``TimerSet`` per due offset (timer ids ``prefix-i``), in big transactions."""
    store = MessageStore(db, registry)
    encode = registry.encode
    batch: list[NewMessage] = []
    for i, due_in in enumerate(dues):
        timer_id = f"{prefix}-{i}"
        type_name, payload = encode(TimerSet(timer_id, due_in))
        batch.append(NewMessage(topic=TOPIC, source=timer_id, type=type_name, payload=payload))
        if len(batch) >= APPEND_CHUNK:
            with db.transaction() as conn:
                store.append_encoded(conn, batch)
            batch = []
    if batch:
        with db.transaction() as conn:
            store.append_encoded(conn, batch)


def db_now(db: Database) -> float:
    """The database server's time, in seconds since the epoch."""
    with db.read() as conn:
        return float(conn.execute(select(DatabaseClock(db.engine.dialect.name).now())).scalar_one())


def start_overdue_sagas(url: str, prefix: str, count: int, spec: ConsumerSpec, hooks: Any) -> None:
    """Start ``count`` sagas through an instance whose manual clock is an hour back: their
    deadlines are stored, all overdue by the real clock, none delivered."""
    real = Database(url, tenant=TENANT, table_prefix=prefix)
    try:
        back = db_now(real) - SETUP_CLOCK_OFFSET
        append_starts(real, "t", [1.0 + i * 1e-4 for i in range(count)])
    finally:
        real.dispose()
    db = Database(url, tenant=TENANT, table_prefix=prefix, clock=ManualClock(back))
    instance = Instance(db, [spec], settings(0.2), hooks, name="deadlines-setup")
    PROBE.reset()
    try:
        instance.start(loops=False)
        worker = instance.workers[SAGA]
        while worker.poll():
            pass
    finally:
        instance.stop()
        db.dispose()
    if PROBE.applied != count or PROBE.delivered:
        raise BenchmarkFailure(
            f"setup applied {PROBE.applied} of {count} starts, delivered {PROBE.delivered}"
        )


Run = tuple[float, Costs]
"""Deadlines/s of one run, and what it cost."""
TableRows = tuple[tuple[str, ...], list[tuple[Any, ...]]]
"""A table's rows: its column names, and each row's values."""
Snapshot = tuple[TableRows, TableRows]


def snapshot(db: Database) -> Snapshot:
    """The saga's state and deadline rows, as tuples of plain values: the garbage collector
    stops tracking those, so the snapshot (40,000 rows) held through every run does not
    weigh on the collections of the code measured (dicts of them were all walked by every
    full collection, and the framework's loop, allocating more, triggers more of them)."""
    s, d = db.schema.sagas, db.schema.deadlines
    tables = []
    with db.read() as conn:
        for table in (s, d):
            result = conn.execute(select(table).where(table.c.saga == SAGA))
            tables.append((tuple(result.keys()), [tuple(row) for row in result]))
    gc.collect()  # untracks the tuples now
    return tables[0], tables[1]


def restore(db: Database, rows: Snapshot) -> None:
    """Put the saga's state and deadline rows back as snapshotted."""
    s, d, m = db.schema.sagas, db.schema.deadlines, db.schema.messages
    with db.transaction() as conn:
        conn.execute(delete(s).where(s.c.saga == SAGA))
        conn.execute(delete(d).where(d.c.saga == SAGA))
        conn.execute(delete(m).where(m.c.tenant == TENANT, m.c.topic == ELAPSED))
        for table, (columns, values) in zip((s, d), rows, strict=True):
            for start_at in range(0, len(values), APPEND_CHUNK):
                chunk = values[start_at : start_at + APPEND_CHUNK]
                conn.execute(insert(table), [dict(zip(columns, v, strict=True)) for v in chunk])


def verify(db: Database, label: str, prefix: str, count: int, delivered: int) -> None:
    """Every ``prefix-*`` saga fired exactly once and sent one command, ``delivered`` says
    ``count``, none left."""
    s, d, m = db.schema.sagas, db.schema.deadlines, db.schema.messages
    with db.read() as conn:
        states = conn.execute(
            select(s.c.state).where(
                s.c.tenant == TENANT, s.c.saga == SAGA, s.c.saga_key.like(f"{prefix}-%")
            )
        ).scalars()
        fired = [json.loads(state)["fired"] for state in states]
        left = conn.execute(
            select(func.count()).select_from(d).where(d.c.tenant == TENANT, d.c.saga == SAGA)
        ).scalar_one()
        sent, senders = conn.execute(
            select(func.count(), func.count(distinct(m.c.source))).where(
                m.c.tenant == TENANT, m.c.topic == ELAPSED, m.c.source.like(f"{prefix}-%")
            )
        ).one()
    wrong = [f for f in fired if f != 1]
    if delivered != count or len(fired) != count or wrong or left or not sent == senders == count:
        raise BenchmarkFailure(
            f"{label}: {delivered} deliveries counted for {count} deadlines; "
            f"{len(fired)} sagas, {len(wrong)} not fired exactly once "
            f"(counters {sorted(set(wrong))[:5]}); {left} deadlines left; "
            f"{sent} commands sent by {senders} sagas"
        )


# -- the framework --------------------------------------------------------------------------


@contextmanager
def running_instance(db: Database, spec: ConsumerSpec, hooks: Any, idle: float) -> Iterator[None]:
    """A real instance on ``db`` with its threads, stopped gracefully at the end."""
    name = f"deadlines-{uuid.uuid4().hex[:6]}"
    instance = Instance(db, [spec], settings(idle), hooks, name=name)
    try:
        instance.start()
        yield
    finally:
        instance.stop()


def framework_run(db: Database, rows: Snapshot, count: int, spec: ConsumerSpec, hooks: Any) -> Run:
    """Restore the overdue deadlines, start an instance on ``db``; deadlines/s until all
    delivered, and the costs from its first round to the last delivery."""
    restore(db, rows)
    PROBE.reset()
    PROBE.server = Server(db.url)
    gc.collect()  # every run starts without the previous ones' garbage pending
    with running_instance(db, spec, hooks, 0.2):
        PROBE.wait(lambda: PROBE.delivered >= count, f"{count} deliveries")
        costs = PROBE.costs(count)
        delivered = PROBE.delivered
    verify(db, "framework", "t", count, delivered)
    return count / costs.wall, costs


@attrs.define(kw_only=True)
class Lateness:
    """One lateness run: each deadline's lateness, and how long applying the starts took."""

    seconds: list[float]
    starting: float


def lateness_run(
    url: str, prefix: str, run: int, options: Options, spec: ConsumerSpec, hooks: Any
) -> Lateness:
    """Start sagas with deadlines spread over ``options.spread`` seconds; their lateness."""
    PROBE.reset()
    name, count = f"late{run}", options.lateness_deadlines
    dues = [LATENESS_LEAD + options.spread * i / count for i in range(count)]
    db = Database(url, tenant=TENANT, table_prefix=prefix)
    try:
        with running_instance(db, spec, hooks, options.idle):
            appended = time.perf_counter()
            append_starts(db, name, dues)
            PROBE.wait(lambda: PROBE.applied >= count, f"{count} starts applied")
            starting = time.perf_counter() - appended
            PROBE.wait(lambda: PROBE.delivered >= count, f"{count} deliveries")
            lateness, delivered = list(PROBE.lateness), PROBE.delivered
        verify(db, "lateness", name, count, delivered)
    finally:
        db.dispose()
    return Lateness(seconds=lateness, starting=starting)


# -- hand-written loops -----------------------------------------------------------------


class HandWritten:
    """The best delivery loop a person writes with a DB-API connection. Per batch, one
    transaction: one read of the due deadlines with their sagas' states (joined on the
    sagas' primary key), each partition's earliest as a range of the
    ``(tenant, saga, partition_no, due_at)`` index (``UNION ALL``, as the framework
    reads them); one ``DELETE`` of them
    all (row count checked); the states written from the version read in one statement
    (row count checked); the commands' positions reserved on the tenant's counter and
    the commands inserted as one multi-row ``INSERT``; a guarded checkpoint update of the
    partitions touched (epoch and checkpoint as read, row count checked); one commit.
    Subclasses give the dialect's statements."""

    placeholder = "?"
    now_sql = ""
    part = "SELECT * FROM ({})"
    """One partition's part of the ``UNION ALL`` (MySQL streams parenthesized parts; SQLite
    takes a part with its own ``LIMIT`` only as a subquery)."""

    def __init__(self, prefix: str) -> None:
        p, q = prefix, self.placeholder
        self.prefix = prefix
        # Each partition's earliest due rows, an even share of the batch each, as one range
        # of the index read in order per partition: no sort of the whole overdue backlog.
        share = -(-BATCH // PARTITIONS)
        # Each due deadline with its saga's state: one read (a join on the primary key; an
        # inner join, as every deadline here has its saga, where the framework cannot know).
        self.select_due = " UNION ALL ".join(
            self.part.format(
                f"SELECT d.saga_key, d.name, d.partition_no, d.due_at, d.type, d.payload, "
                f"s.version, s.state FROM {p}deadlines d JOIN {p}sagas s "
                f"ON s.tenant = d.tenant AND s.saga = d.saga AND s.saga_key = d.saga_key "
                f"WHERE d.tenant = '{TENANT}' AND d.saga = '{SAGA}' "
                f"AND d.partition_no = {partition} "
                f"AND d.due_at <= {self.now_sql} ORDER BY d.due_at LIMIT {share}"
            )
            for partition in range(PARTITIONS)
        )
        self.delete_due = (
            f"DELETE FROM {p}deadlines WHERE tenant = {q} AND saga = {q} "
            f"AND saga_key IN ({{keys}}) AND (saga_key, name, due_at) IN ({{rows}})"
        )
        self.insert_message = (
            f"INSERT INTO {p}messages (tenant, position, topic, source, version, type, "
            f"payload, headers, partition_hash, recorded_at) "
            f"VALUES ({q}, {q}, {q}, {q}, {q}, {q}, {q}, {q}, {q}, {q})"
        )
        self.fence = (
            f"UPDATE {p}consumer_partitions SET updated_at = {self.now_sql} "
            f"WHERE tenant = {q} AND consumer = {q} AND (partition_no, epoch, checkpoint) "
            f"IN ({{rows}})"
        )
        self.elapsed_type = registry.type_name(TimerElapsed)

    def begin(self, cur: Any) -> None:
        raise NotImplementedError

    def commit(self, cur: Any) -> None:
        raise NotImplementedError

    def save_states(self, cur: Any, rows: list[tuple[Any, ...]]) -> int:
        """Write ``(next version, state, now, key)`` rows where the version is the one
        before; return how many did not match."""
        raise NotImplementedError

    def reserve(self, cur: Any, count: int) -> int:
        """Reserve ``count`` positions on the tenant's counter; return the first."""
        raise NotImplementedError

    def loop(self, cur: Any) -> int:
        """Deliver until nothing is due; return how many were delivered."""
        q = self.placeholder
        cur.execute(
            f"SELECT partition_no, epoch, checkpoint FROM {self.prefix}consumer_partitions "
            f"WHERE tenant = {q} AND consumer = {q}",
            (TENANT, SAGA),
        )
        claims = {p: (p, epoch, checkpoint) for p, epoch, checkpoint in cur.fetchall()}
        delivered = 0
        loads, dumps, crc32 = json.loads, json.dumps, zlib.crc32
        while True:
            self.begin(cur)
            cur.execute(self.select_due)
            due = sorted(cur.fetchall(), key=lambda row: row[3])[:BATCH]
            if not due:
                self.commit(cur)
                return delivered
            states = {row[0]: (row[6], loads(row[7])) for row in due}
            keys = sorted(states)
            marks = ", ".join([q] * len(keys))
            cur.execute(
                self.delete_due.format(keys=marks, rows=", ".join([f"({q}, {q}, {q})"] * len(due))),
                (TENANT, SAGA, *keys, *(v for row in due for v in row[:2] + row[3:4])),
            )
            if cur.rowcount != len(due):
                raise BenchmarkFailure("hand-written: a deadline vanished")
            for key, _name, _partition, _due_at, _type, payload, *_saga in due:
                if loads(payload)["timer_id"] == key:  # the deadline's message, decoded
                    states[key][1]["fired"] += 1
            now = time.time()
            stale = self.save_states(
                cur, [(states[k][0] + 1, dumps(states[k][1]), now, k) for k in keys]
            )
            if stale:
                raise BenchmarkFailure(f"hand-written: {stale} sagas changed concurrently")
            first = self.reserve(cur, len(due))
            cur.executemany(
                self.insert_message,
                [
                    (
                        TENANT,
                        first + i,
                        ELAPSED,
                        key,
                        1,  # each saga sends one: a new source (the unique key checks it)
                        self.elapsed_type,
                        dumps({"timer_id": key}),
                        dumps({"message-id": uuid.uuid4().hex}),
                        crc32(key.encode()),
                        now,
                    )
                    for i, (key, *_) in enumerate(due)
                ],
            )
            touched = sorted({row[2] for row in due})
            cur.execute(
                self.fence.format(rows=", ".join([f"({q}, {q}, {q})"] * len(touched))),
                (TENANT, SAGA, *(v for p in touched for v in claims[p])),
            )
            if cur.rowcount != len(touched):
                raise BenchmarkFailure("hand-written: a partition moved")
            self.commit(cur)
            delivered += len(due)


class SqliteHandWritten(HandWritten):
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def begin(self, cur: Any) -> None:
        cur.execute("BEGIN IMMEDIATE")

    def commit(self, cur: Any) -> None:
        cur.execute("COMMIT")

    def save_states(self, cur: Any, rows: list[tuple[Any, ...]]) -> int:
        # In the process: an executemany costs no round trips.
        before = cur.connection.total_changes
        cur.executemany(
            f"UPDATE {self.prefix}sagas SET version = ?, state = ?, updated_at = ? "
            f"WHERE tenant = '{TENANT}' AND saga = '{SAGA}' AND saga_key = ? "
            f"AND version = ?",
            [(*row, row[0] - 1) for row in rows],
        )
        return len(rows) - int(cur.connection.total_changes - before)

    def reserve(self, cur: Any, count: int) -> int:
        cur.execute(
            f"UPDATE {self.prefix}positions SET last_position = last_position + ? "
            f"WHERE tenant = ? RETURNING last_position",
            (count, TENANT),
        )
        (last,) = cur.fetchone()
        return int(last) - count + 1

    def run(self, path: str) -> tuple[int, Costs]:
        con = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=NORMAL")
            with measured(Server("sqlite://")) as costs:
                delivered = self.loop(con.cursor())
            return delivered, costs
        finally:
            con.close()


class MysqlHandWritten(HandWritten):
    placeholder = "%s"
    part = "({})"
    now_sql = "UNIX_TIMESTAMP(NOW(6))"

    def begin(self, cur: Any) -> None:
        cur.connection.begin()

    def commit(self, cur: Any) -> None:
        cur.connection.commit()

    def save_states(self, cur: Any, rows: list[tuple[Any, ...]]) -> int:
        # One multi-row upsert (PyMySQL joins an executemany of INSERT ... VALUES); a row
        # counts 2 where its version was the one read, less where it was not.
        read = "version = VALUES(version) - 1"
        cur.executemany(
            f"INSERT INTO {self.prefix}sagas (tenant, saga, version, state, updated_at, "
            f"saga_key, ended, started_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
            f"ON DUPLICATE KEY UPDATE state = IF({read}, VALUES(state), state), "
            f"updated_at = IF({read}, VALUES(updated_at), updated_at), "
            f"version = IF({read}, VALUES(version), version)",
            [(TENANT, SAGA, *row, False, row[2]) for row in rows],
        )
        return len(rows) - int(cur.rowcount) // 2

    def reserve(self, cur: Any, count: int) -> int:
        cur.execute(
            f"UPDATE {self.prefix}positions SET last_position = LAST_INSERT_ID(last_position + %s) "
            f"WHERE tenant = %s",
            (count, TENANT),
        )
        return int(cur.lastrowid) - count + 1

    def run(self, url: str) -> tuple[int, Costs]:
        con = bench_mysql.connect(url)
        try:
            cur = con.cursor()
            with measured(Server(url)) as costs:
                delivered = self.loop(cur)
            return delivered, costs
        finally:
            con.close()


def hand_written_run(url: str, prefix: str, rows: Snapshot, count: int) -> Run:
    """Restore the overdue deadlines, run the hand-written loop; deadlines/s, costs."""
    db = Database(url, tenant=TENANT, table_prefix=prefix)
    try:
        restore(db, rows)
        gc.collect()  # every run starts without the previous ones' garbage pending
        if db.is_sqlite:
            delivered, costs = SqliteHandWritten(prefix).run(make_url(db.url).database or "")
        else:
            delivered, costs = MysqlHandWritten(prefix).run(db.url)
        verify(db, "hand-written", "t", count, delivered)
    finally:
        db.dispose()
    costs.count = count
    return count / costs.wall, costs


# -- driving ----------------------------------------------------------------------------


@attrs.define(kw_only=True)
class Options:
    deadlines: int
    runs: int
    lateness_deadlines: int
    lateness_runs: int
    spread: float
    idle: float


def measure(label: str, url: str, prefix: str, options: Options) -> None:
    """Set up, then alternate framework and hand-written runs; then the lateness runs."""
    spec, hooks = saga_spec()
    db = Database(url, tenant=TENANT, table_prefix=prefix)
    try:
        if not db.is_sqlite:
            migrate(db)
        db.prepare()
        count = options.deadlines
        start_overdue_sagas(url, prefix, count, spec, hooks)
        rows = snapshot(db)
        if len(rows[1][1]) != count:
            raise BenchmarkFailure(f"setup stored {len(rows[1][1])} deadlines, not {count}")
    finally:
        db.dispose()
    ours: list[Run] = []
    theirs: list[Run] = []
    # The framework's runs share one engine, as the instances of a process's lifetime do:
    # its statements are compiled once (in the first run, kept out of the median).
    db = Database(url, tenant=TENANT, table_prefix=prefix)
    try:
        cold = framework_run(db, rows, count, spec, hooks)
        for _ in range(options.runs):  # interleaved: a passing load weighs on both alike
            ours.append(framework_run(db, rows, count, spec, hooks))
            theirs.append(hand_written_run(url, prefix, rows, count))
    finally:
        db.dispose()
    lateness = [
        lateness_run(url, prefix, run, options, spec, hooks) for run in range(options.lateness_runs)
    ]
    report(label, options, cold, ours, theirs, lateness)


def report(
    label: str,
    options: Options,
    cold: Run,
    our_runs: list[Run],
    their_runs: list[Run],
    lateness: list[Lateness],
) -> None:
    """The compact summary of one backend."""
    ours, theirs = [r for r, _c in our_runs], [r for r, _c in their_runs]
    theirs_median = statistics.median(theirs)
    baseline = "sqlite3" if label == "sqlite" else "PyMySQL"
    print(
        f"{label}: {options.deadlines} overdue deadlines, batch {BATCH}, "
        f"median of {options.runs} runs (every deadline delivered once, none left)"
    )
    what = "framework (SagaWorker):"
    print(f"  {what:<28} {statistics.median(ours):>8,.0f} deadlines/s  runs {_fmt(ours)}")
    what = "  its first run (compiling):"
    print(f"  {what:<28} {cold[0]:>8,.0f} deadlines/s  (not in the median)")
    what = f"hand-written {baseline} loop:"
    print(f"  {what:<28} {theirs_median:>8,.0f} deadlines/s  runs {_fmt(theirs)}")
    print(f"  ratio framework/hand-written: {statistics.median(ours) / theirs_median:.2f}")
    pairs = [a / b for a, b in zip(ours, theirs, strict=True)]
    print(f"  per run, framework/hand-written: {spread(pairs)}")
    print(
        cpu_ratio(
            "hand-written", [c for _r, c in our_runs], [c for _r, c in their_runs], "deadline"
        )
    )
    pooled = [x for run in lateness for x in run.seconds]
    cuts = statistics.quantiles(pooled, n=100, method="inclusive")
    p50, p95, p99, worst = cuts[49], cuts[94], cuts[98], max(pooled)
    print(
        f"  lateness, {options.lateness_deadlines} deadlines due over {options.spread:g} s "
        f"x {len(lateness)} runs: p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {worst * 1000:.0f} ms"
    )
    within = sum(1 for x in pooled if x <= options.idle) / len(pooled)
    print(
        f"  vs idle-poll-interval {options.idle * 1000:.0f} ms: p50 {p50 / options.idle:.2f}, "
        f"p99 {p99 / options.idle:.2f}, max {worst / options.idle:.2f} intervals; "
        f"{within:.1%} within one interval"
    )
    starting = max(run.starting for run in lateness)
    note = "" if starting < LATENESS_LEAD else "  (OVERLAPPED the first deadlines: load)"
    print(
        f"  (starts applied within {starting:.2f} s of the append; first deadline after "
        f"{LATENESS_LEAD:g} s){note}",
        flush=True,
    )


def _fmt(rates: Sequence[float]) -> str:
    return ", ".join(f"{r:,.0f}" for r in rates)


def run_sqlite(options: Options) -> None:
    """Measure on a SQLite file in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="deadlines-") as tmp:
        measure("sqlite", f"sqlite:///{os.path.join(tmp, 'bench.db')}", "prj_", options)


def run_mysql(url: str, options: Options) -> None:
    """Measure in a scratch database, under a unique table prefix whose tables are dropped."""
    prefix = f"bench{uuid.uuid4().hex[:8]}_"
    with bench_mysql.scratch_database(url, "deadlines") as target:
        try:
            measure("mysql", target, prefix, options)
        finally:
            db = Database(target, table_prefix=prefix)
            with db.engine.begin() as conn:
                for name in inspect(conn).get_table_names():
                    if name.startswith(prefix):
                        conn.execute(text(f"DROP TABLE IF EXISTS `{name}`"))
            db.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deadlines", type=int, default=20_000, help="overdue (20000)")
    parser.add_argument("--runs", type=int, default=5, help="throughput runs of each kind (5)")
    parser.add_argument(
        "--lateness-deadlines", type=int, default=2_000, help="deadlines per lateness run (2000)"
    )
    parser.add_argument("--lateness-runs", type=int, default=2, help="lateness runs (2)")
    parser.add_argument(
        "--spread", type=float, default=3.0, help="seconds the lateness deadlines span (3)"
    )
    parser.add_argument(
        "--idle-poll-interval", type=float, default=0.2, help="seconds (0.2, the default)"
    )
    parser.add_argument("--mysql-url", help="also benchmark on MySQL/MariaDB at this URL")
    args = parser.parse_args(argv)
    if min(args.deadlines, args.runs, args.lateness_runs) < 1 or args.lateness_deadlines < 2:
        parser.error("--deadlines and the runs must be at least 1, --lateness-deadlines 2")
    options = Options(
        deadlines=args.deadlines,
        runs=args.runs,
        lateness_deadlines=args.lateness_deadlines,
        lateness_runs=args.lateness_runs,
        spread=args.spread,
        idle=args.idle_poll_interval,
    )
    # Each backend in a process of its own: what one leaves in the heap (engines,
    # statements, rows) would weigh on the other's garbage collections.
    spawn = multiprocessing.get_context("spawn")
    parts: list[tuple[Callable[..., None], tuple[Any, ...]]] = [(run_sqlite, (options,))]
    if args.mysql_url:
        parts.insert(0, (run_mysql, (args.mysql_url, options)))
    failed = False
    for index, (part, part_args) in enumerate(parts):
        if index:
            print(flush=True)
        process = spawn.Process(target=_benchmark, args=(part, *part_args))
        process.start()
        process.join()
        failed = failed or process.exitcode != 0
    return 1 if failed else 0


def _benchmark(part: Callable[..., None], *args: Any) -> None:
    """Run one backend's part; exit 1 with the reason if the benchmark failed."""
    try:
        part(*args)
    except BenchmarkFailure as exc:
        print(f"BENCHMARK FAILED: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
