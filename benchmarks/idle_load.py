"""Statements/s that one idle instance sends its database, with 1 and with 20 consumers.

Run as ``python benchmarks/idle_load.py [--seconds 20] [--mysql-url URL]
[--timing heartbeat-interval=1s ...]`` (``--timing``: a ``messaging.consumer`` setting
instead of its default, to see what shorter intervals cost).

One ``messaging.Instance`` runs in this process at the default settings (heartbeat 5 s,
rebalance 10 s, idle-poll 200 ms) with N projections (N = 1, then 20), each reading a
topic of its own with 8 partitions, all owned by this instance, every topic empty. Over
``--seconds`` of steady idle state (start-up excluded) a ``before_cursor_execute``
listener on its engine counts every statement by thread and kind, and the engine's
commit and rollback events count ``COMMIT``/``ROLLBACK``. On MySQL/MariaDB
(``--mysql-url``) the same runs use a scratch database of their own, dropped at the end.

A design that polls each consumer sends N queries per idle-poll-interval; here one pulse
per instance tells every consumer whether its topic has anything new, so the load
should hardly grow with N. Each backend ends with ``ratio 20 consumers / 1 consumer:
X.XX`` (the goal is 1.5 at most).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Measure this checkout's code, whichever checkout an editable install points at.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import attrs
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url

from messaging import (
    Database,
    HandlerContext,
    Instance,
    create_plugin_manager,
    handler,
    message,
)
from messaging._config import parse_duration, settings_from_mapping
from messaging._consumers import collect_specs
from messaging.store._migrations import migrate
from projections import projection

PREFIX = "idle_"
PARTITIONS = 8
COUNTS = (1, 20)
QUERIES = ("SELECT", "INSERT", "UPDATE", "DELETE")
"""Statement kinds that read or write data; everything else is transaction control."""
_VERB = re.compile(r"\s*(\w*)")
_TABLE = re.compile(r"\b(?:FROM|UPDATE|INTO)\s+`?(\w+)`?", re.IGNORECASE)


@message("bench.idle.tick")
@attrs.define(frozen=True)
class Tick:
    n: int


def consumers(count: int) -> list[type]:
    """``count`` projections, ``idle-<k>`` on topic ``idle-<k>``, each doing nothing."""
    classes: list[type] = []
    for k in range(count):

        class Idle:
            @handler
            def tick(self, tick: Tick, ctx: HandlerContext) -> None:
                pass

        classes.append(projection(f"idle-{k:02d}", topics=f"idle-{k:02d}", partitions=8)(Idle))
    return classes


def _kind(statement: str) -> str:
    """``VERB table`` of an SQL statement, the table without its prefix."""
    verb = _VERB.match(statement).group(1).upper()  # type: ignore[union-attr]
    table = _TABLE.search(statement)
    name = table.group(1).removeprefix(PREFIX) if table else ""
    return f"{verb} {name}".strip()


class StatementCounter:
    """Counts the statements an engine executes, by (thread, statement kind)."""

    def __init__(self, engine: Engine) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.counting = False
        self._lock = threading.Lock()
        event.listen(engine, "before_cursor_execute", self._on_statement)
        event.listen(engine, "commit", lambda _conn: self._add("COMMIT"))
        event.listen(engine, "rollback", lambda _conn: self._add("ROLLBACK"))
        event.listen(engine, "connect", lambda *_: self._add("(new connection)"))

    def _add(self, kind: str) -> None:
        if self.counting:
            with self._lock:
                thread = threading.current_thread().name.split("/")[0]
                self.counts[(thread.split(":")[0], kind)] += 1

    def _on_statement(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        self._add(_kind(statement))


def run_idle(
    url: str, count: int, seconds: float, warmup: float, timing: Mapping[str, str]
) -> Counter[tuple[str, str]]:
    """Run an idle instance of ``count`` consumers with the consumer settings ``timing``;
    its statements over ``seconds``."""
    consumer = {"messaging": {"consumer": dict(timing)}}
    settings = settings_from_mapping({"database": url, "table-prefix": PREFIX, **consumer})
    db = Database(url, table_prefix=PREFIX)
    if not db.is_sqlite:
        migrate(db)
    counter = StatementCounter(db.engine)
    hooks = create_plugin_manager([], load_entrypoints=False).hook
    instance = Instance(db, collect_specs(consumers(count)), settings, hooks, name="idle")
    instance.start()
    try:
        claimed = sum(len(w.claims()) for w in instance.workers.values())
        assert claimed == PARTITIONS * count, f"the instance claimed {claimed} partitions"
        time.sleep(warmup)
        counter.counting = True
        time.sleep(seconds)
        counter.counting = False
    finally:
        instance.stop()
        db.dispose()
    return counter.counts


def report(counts: Mapping[tuple[str, str], int], seconds: float, count: int, idle: float) -> float:
    """Print per-second figures by (thread, kind); return the total per second."""
    total = sum(counts.values()) / seconds
    queries = sum(n for (_, kind), n in counts.items() if kind.startswith(QUERIES)) / seconds
    print(f"  {count} consumer(s): {total:.2f} statements/s (queries {queries:.2f}/s)")
    for (thread, kind), n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        print(f"    {n / seconds:8.2f}/s  {thread:<12} {kind}")
    print(f"    (a poll per consumer per idle-poll-interval alone would be {count / idle:.0f}/s)")
    return total


def measure(
    label: str, url_for: Any, seconds: float, warmup: float, timing: Mapping[str, str]
) -> float:
    intervals = ", ".join(f"{k} {v}" for k, v in timing.items()) or "default intervals"
    print(f"\n{label}: one idle instance, {intervals}, {seconds:g} s per measurement")
    totals = {}
    for count in COUNTS:
        with url_for() as url:
            counts = run_idle(url, count, seconds, warmup, timing)
            idle = parse_duration(timing.get("idle-poll-interval", "200ms"))
            totals[count] = report(counts, seconds, count, idle)
    ratio = totals[COUNTS[-1]] / totals[COUNTS[0]]
    print(f"ratio {COUNTS[-1]} consumers / {COUNTS[0]} consumer: {ratio:.2f}  (goal <= 1.50)")
    return ratio


@contextmanager
def scratch_sqlite(directory: Path) -> Iterator[str]:
    yield f"sqlite:///{directory}/{uuid.uuid4().hex[:6]}.db"


@contextmanager
def scratch_mysql(url: str) -> Iterator[str]:
    """A database of this run's own on the server of ``url``; dropped at the end."""
    parsed = make_url(url if "+" in url.split("://")[0] else url.replace("://", "+pymysql://", 1))
    name = f"prj_idle_{uuid.uuid4().hex[:10]}"
    engine = create_engine(parsed)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    try:
        yield parsed.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="idle time before measuring")
    parser.add_argument("--mysql-url", help="also measure on this MySQL/MariaDB server")
    parser.add_argument(
        "--timing",
        action="append",
        default=[],
        metavar="KEY=DURATION",
        help="a messaging.consumer setting, e.g. idle-poll-interval=50ms (repeatable)",
    )
    args = parser.parse_args(argv)
    timing = dict(item.split("=", 1) for item in args.timing)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="idle-load-") as tmp:
        sqlite = lambda: scratch_sqlite(Path(tmp))  # noqa: E731
        ratios.append(measure("sqlite", sqlite, args.seconds, args.warmup, timing))
        if args.mysql_url:
            mysql = lambda: scratch_mysql(args.mysql_url)  # noqa: E731
            ratios.append(measure("mysql", mysql, args.seconds, args.warmup, timing))
    return 0 if all(r <= 1.5 for r in ratios) else 1


if __name__ == "__main__":
    sys.exit(main())
