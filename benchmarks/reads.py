"""The batch read on a long stream: does it stay an index range, whatever the checkpoint?

Run as ``python benchmarks/reads.py --mysql-url URL [--messages N]`` (10,000,000 by
default: about three minutes to fill on a 2-core machine; ``--messages 200000`` takes
seconds).

One topic is filled with ``--messages`` messages of 1,000 sources (so 16 partitions
are evenly mixed along the positions) by ``INSERT ... SELECT`` from MariaDB's sequence
engine, in transactions of a million rows. An instance owning 4 of 16 partitions then
reads batches of 500 with :meth:`MessageStore.read_batch`, exactly as a worker does,
from the start of the stream, its middle, near its end (a last, partial batch) and at
its head (caught up: nothing to return). For each position it prints the ``EXPLAIN``
of the statement sent (access type, key, key length), the session's ``Handler_read_*``
counters around one read (``SHOW SESSION STATUS``), rows returned beside rows examined
(``Handler_read_next``: the index entries the server walked; ``Handler_icp_attempts``
when the index condition is pushed down), and the median time of ``--reads`` reads.

A batch read for 4 of 16 partitions walks the topic's index range from the lowest
checkpoint, in position order, and stops at the batch's last row: it examines the rows
of that range, its own and those of the 12 other partitions between them (about 4 per
row returned), and none before the checkpoint, so its cost does not grow with the
stream. The scratch database, and so the table, is dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Measure this checkout's code, whichever checkout an editable install points at.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import attrs
from sqlalchemy import Connection, event, text

import bench_mysql
from messaging import Database, MessageStore
from messaging.store._migrations import migrate

TOPIC = "reads"
PARTITIONS = 16
OWNED = (1, 6, 11, 14)
"""The instance's 4 partitions of 16."""
BATCH = 500
SOURCES = 1_000
"""Few enough that the rows each source gets next stay in the buffer pool: filling is
sequential in every index."""
FILL_CHUNK = 1_000_000
PAYLOAD_PAD = "x" * 80
"""About the size of a small event's JSON."""


def fill(db: Database, messages: int, chunk: int = FILL_CHUNK) -> None:
    """Append ``messages`` messages of ``SOURCES`` sources to ``TOPIC``, positions 1 to
    ``messages``, as the store would (each source's versions 1, 2, ...; its partition
    hash the CRC32 of its id), straight from the sequence engine."""
    m = db.schema.messages
    with db.engine.connect() as conn:
        for first in range(1, messages + 1, chunk):
            last = min(messages, first + chunk - 1)
            with conn.begin():
                conn.execute(
                    text(
                        f"INSERT INTO {m.name} (tenant, position, topic, source, version, "
                        "type, payload, headers, partition_hash, recorded_at) "
                        "SELECT :tenant, seq, :topic, CONCAT('src-', MOD(seq, :sources)), "
                        "seq DIV :sources + 1, 'bench.reads.item', "
                        "CONCAT('{\"n\": ', seq, ', \"pad\": \"', :pad, '\"}'), NULL, "
                        "CRC32(CONCAT('src-', MOD(seq, :sources))), UNIX_TIMESTAMP() "
                        f"FROM seq_{first}_to_{last}"
                    ),
                    {"tenant": db.tenant, "topic": TOPIC, "sources": SOURCES, "pad": PAYLOAD_PAD},
                )
        with conn.begin():
            p = db.schema.positions
            conn.execute(p.update().where(p.c.tenant == db.tenant).values(last_position=messages))


@attrs.define(kw_only=True)
class ReadCost:
    """One batch read from ``after``: its plan, what it returned and what it walked."""

    after: int
    returned: int
    handler: dict[str, int]
    """The change in each ``Handler_read_*`` / ``Handler_icp_*`` counter over the read."""
    plan: list[dict[str, Any]]
    seconds: float

    @property
    def examined(self) -> int:
        """Rows the server walked: index entries read in order, or, if the index condition
        is pushed down, those handed up after it (the ones it had to fetch whole)."""
        return self.handler["Handler_read_next"] + self.handler["Handler_read_first"]


def _counters(conn: Connection) -> dict[str, int]:
    rows = conn.exec_driver_sql(
        "SHOW SESSION STATUS WHERE Variable_name LIKE 'Handler_read%%' "
        "OR Variable_name LIKE 'Handler_icp%%'"
    )
    return {name: int(value) for name, value in rows}


@contextmanager
def _captured(db: Database) -> Iterator[list[tuple[str, Any]]]:
    """The statements sent meanwhile, with their parameters."""
    sent: list[tuple[str, Any]] = []

    def record(_c: Any, _cur: Any, statement: str, params: Any, *_: Any) -> None:
        sent.append((statement, params))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def read_cost(db: Database, store: MessageStore, after: int, reads: int = 5) -> ReadCost:
    """Read one batch of the owned partitions from checkpoint ``after``: its plan, its
    counters (one read), and the median time of ``reads`` reads."""
    partitions = dict.fromkeys(OWNED, after)

    def read(conn: Connection) -> int:
        rows = store.read_batch(
            conn, [TOPIC], partitions=partitions, partition_count=PARTITIONS, limit=BATCH
        )
        return len(rows)

    with db.read() as conn, _captured(db) as sent:
        read(conn)  # once through SQLAlchemy: the statement as sent, and the plan learnt
    ((statement, params),) = sent
    with db.read() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cursor = raw.cursor()
        cursor.execute(f"EXPLAIN {statement}", params)
        names = [d[0] for d in cursor.description]
        plan = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        cursor.close()
        before = _counters(conn)
        returned = read(conn)
        after_counters = _counters(conn)
        times = []
        for _ in range(reads):
            started = time.perf_counter()
            read(conn)
            times.append(time.perf_counter() - started)
    handler = {name: after_counters[name] - before[name] for name in before}
    # SHOW STATUS itself reads no table rows, but count what the probe costs anyway.
    return ReadCost(
        after=after,
        returned=returned,
        handler=handler,
        plan=plan,
        seconds=statistics.median(times),
    )


def positions(messages: int) -> list[tuple[str, int]]:
    """The checkpoints to read from: start, middle, a last partial batch, caught up."""
    last_batch = messages - (BATCH * PARTITIONS // len(OWNED)) // 2
    return [
        ("start", 0),
        ("middle", messages // 2),
        ("end", max(0, last_batch)),
        ("head", messages),
    ]


def report(label: str, cost: ReadCost) -> None:
    """One read's figures, on two lines."""
    (row,) = cost.plan
    icp = cost.handler.get("Handler_icp_attempts", 0)
    ratio = cost.examined / cost.returned if cost.returned else float("nan")
    print(
        f"  {label:<6} after {cost.after:>10,}: EXPLAIN type={row['type']} key={row['key']} "
        f"key_len={row['key_len']} Extra={row['Extra']!r}"
    )
    nonzero = {k.removeprefix("Handler_"): v for k, v in cost.handler.items() if v}
    print(
        f"         returned {cost.returned:>4}, examined {cost.examined:>5} "
        f"({ratio:.2f} per row returned; index entries checked in the engine {icp}); "
        f"{cost.seconds * 1000:.2f} ms per read; counters {nonzero}"
    )


def measure(url: str, messages: int, reads: int) -> None:
    """Fill a scratch table, read from each position, print the figures."""
    db = Database(url, table_prefix="reads_")
    try:
        migrate(db)
        db.prepare()
        started = time.perf_counter()
        fill(db, messages)
        print(
            f"{messages:,} messages of {SOURCES:,} sources in topic {TOPIC!r}, filled in "
            f"{time.perf_counter() - started:.0f} s; read_batch of partitions {OWNED} of "
            f"{PARTITIONS}, batch {BATCH}, median of {reads} reads"
        )
        store = MessageStore(db)
        for label, after in positions(messages):
            report(label, read_cost(db, store, after, reads))
    finally:
        db.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mysql-url", required=True, help="the MySQL/MariaDB server")
    parser.add_argument("--messages", type=int, default=10_000_000, help="(10000000)")
    parser.add_argument("--reads", type=int, default=20, help="timed reads per position (20)")
    args = parser.parse_args(argv)
    if args.messages < BATCH * PARTITIONS or args.reads < 1:
        parser.error(f"--messages must be at least {BATCH * PARTITIONS}, --reads at least 1")
    with bench_mysql.scratch_database(args.mysql_url, "reads") as url:
        measure(url, args.messages, args.reads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
