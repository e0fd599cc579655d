"""Seconds ``projections messages check`` takes on a long stream, on MySQL/MariaDB.

Run as ``python benchmarks/messages_check.py --mysql-url URL [--messages N]``.

Seeds a scratch database with ``N`` messages (default ten million) of a few topics,
types and payload versions: about ten thousand appended, then copied onto themselves
server-side (``INSERT ... SELECT``) until there are ``N``. Then times the report the
command prints (:func:`projections._shapes.shapes_report`: one ``GROUP BY`` over the
index ``ix_messages_shape``), twice, and checks its counts add up to ``N``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sqlalchemy import func, select, text

import bench_mysql
from messaging import Database, MessageStore, NewMessage
from messaging._messages import MessageRegistry
from messaging.store._migrations import migrate
from projections._shapes import shapes_report

SHAPES = [("orders", "order.placed", 1), ("orders", "order.placed", 2), ("orders", "order.paid", 1)]
SHAPES += [("stock", "stock.moved", 1), ("stock", "stock.counted", 3)]
_COPY_CHUNK = 200_000


def seed(db: Database, count: int) -> int:
    """Append ``count`` messages (at least the first ten thousand), copying them onto
    themselves server-side; return how many there are."""
    first = min(count, 10_000)
    rows = [
        NewMessage(
            topic=topic,
            source=f"s{i}",
            type=type_name,
            payload=json.dumps({"n": i}),
            payload_version=version,
        )
        for i in range(first)
        for topic, type_name, version in [SHAPES[i % len(SHAPES)]]
    ]
    with db.transaction() as conn:
        MessageStore(db).append_encoded(conn, rows)
    m, have, round_ = db.schema.messages.name, first, 0
    columns = "tenant, position, topic, source, version, type, payload, headers, "
    columns += "partition_hash, recorded_at, payload_version"
    while have < count:
        round_ += 1
        take = min(have, count - have)
        for start in range(0, take, _COPY_CHUNK):  # short statements, one commit each
            end = min(take, start + _COPY_CHUNK)
            with db.engine.begin() as conn:
                conn.execute(
                    text(
                        f"INSERT INTO {m} ({columns}) SELECT tenant, position + {have}, topic, "
                        f"CONCAT(source, '-{round_}'), version, type, payload, headers, "
                        f"partition_hash, recorded_at, payload_version FROM {m} "
                        f"WHERE position > {start} AND position <= {end}"
                    )
                )
        have += take
        with db.engine.begin() as conn:
            conn.execute(text(f"UPDATE {db.schema.positions.name} SET last_position = {have}"))
        print(f"  seeded {have:,}", file=sys.stderr, flush=True)
    return have


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mysql-url", required=True, help="MySQL/MariaDB server URL")
    parser.add_argument("--messages", type=int, default=10_000_000, help="stream length")
    args = parser.parse_args(argv)
    with bench_mysql.scratch_database(args.mysql_url, "shapes") as url:
        db = Database(url, table_prefix="bench_", answer_timeout=600)
        try:
            migrate(db)
            db.prepare()
            started = time.perf_counter()
            count = seed(db, args.messages)
            print(f"seeded {count:,} messages in {time.perf_counter() - started:.1f} s")
            with db.read() as conn:
                assert (
                    conn.execute(select(func.count()).select_from(db.schema.messages)).scalar_one()
                    == count
                )
            registry = MessageRegistry()
            for _ in range(2):
                started = time.perf_counter()
                report = shapes_report(db, registry)
                took = time.perf_counter() - started
                total = sum(entry["count"] for entry in report["shapes"])
                assert total == count, (total, count)
                shapes = len(report["shapes"])
                print(f"messages check: {shapes} shapes of {total:,} messages in {took:.2f} s")
        finally:
            db.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
