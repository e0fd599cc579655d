"""Statements/s that one idle instance sends its database, against the polling minimum.

Run as ``python benchmarks/idle_load.py [--seconds 20] [--mysql-url URL]``.

Runs one instance of ``projections.examples.ledger`` (the ``ledger-balances``
projection, 8 partitions, all owned by this instance, and the in-memory
``ledger-activity``) on an empty topic, once with the default intervals (heartbeat 5s,
rebalance 10s, idle-poll 200ms) and once with the fast intervals of the multiprocess
tests (heartbeat 200ms, rebalance 300ms, idle-poll 50ms), and counts what it sends the
database over ``--seconds`` of steady idle state (start-up excluded):

- SQLite: the instance runs in this process (``messaging.Instance`` with
  ``start()``/``stop()``). A ``before_cursor_execute`` listener on its engine counts
  every statement (``BEGIN`` included) by thread and kind; the engine's commit and
  rollback events count ``COMMIT``/``ROLLBACK``, which pysqlite sends without a cursor.
- MySQL/MariaDB (``--mysql-url``; a scratch database of this run's own, dropped at the
  end): a real ``projections run`` process. It connects through a small TCP relay
  here that counts the MySQL protocol commands it sends (each ``COM_QUERY`` by
  statement kind, ``COM_PING``, ...): exact, whatever else uses the server. The
  server-side figure is also printed: the ``SHOW GLOBAL STATUS`` ``Questions`` delta
  during the run minus the mean of the intervals with no instance running just before
  and after it. Those counters are server-wide, so that figure is only as good as the
  server is quiet; the relay's count is the one the ratio uses.

The minimum a polling design needs is one query per idle-poll-interval per polled
consumer. Each run prints ``ratio measured/minimum: X.XX``: everything sent
(transaction control and pings included) over that minimum.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
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

from sqlalchemy import create_engine, event, select, text
from sqlalchemy.engine import Engine, make_url

from messaging import Database, Instance, collect_consumers, create_plugin_manager
from messaging.config import settings_from_mapping
from messaging.store.migrations import migrate

SRC = str(Path(__file__).resolve().parents[1] / "src")
APP = "projections.examples.ledger"
PREFIX = "idle_"
PARTITIONS = 8  # ledger-balances
CONFIGS: dict[str, dict[str, Any]] = {
    "default intervals (heartbeat 5s, rebalance 10s, idle-poll 200ms)": {},
    "fast test intervals (heartbeat 200ms, rebalance 300ms, idle-poll 50ms)": {
        "rebalance-interval": "300ms",
        "stale-instance-timeout": "1s",
        "heartbeat-interval": "200ms",
        "graceful-shutdown-timeout": "3s",
        "idle-poll-interval": "50ms",
        "conflict-retry": {"max-retries": 5, "max-delay": "100ms"},
    },
}
QUERIES = ("SELECT", "INSERT", "UPDATE", "DELETE")
"""Statement kinds that read or write data; everything else is overhead."""
SERVER_COUNTERS = (
    "Questions",
    "Com_select",
    "Com_update",
    "Com_insert",
    "Com_delete",
    "Com_commit",
    "Com_rollback",
    "Com_set_option",
    "Com_admin_commands",
)
_VERB = re.compile(r"\s*(\w*)")
_TABLE = re.compile(r"\b(?:FROM|UPDATE|INTO)\s+`?(\w+)`?", re.IGNORECASE)
_MYSQL_COMMANDS = {0x01: "QUIT", 0x0E: "PING", 0x11: "CHANGE_USER", 0x1F: "RESET_CONNECTION"}


def _settings(url: str, consumer: Mapping[str, Any]) -> Any:
    return settings_from_mapping(
        {"database": url, "table-prefix": PREFIX, "messaging": {"consumer": dict(consumer)}}
    )


def _minimum(consumer: Mapping[str, Any]) -> tuple[float, int]:
    """(queries/s a polling design needs at the least, consumers polled)."""
    settings = _settings("sqlite:///unused.db", consumer)
    manager = create_plugin_manager([APP], load_entrypoints=False)
    polled = len(collect_consumers(manager))
    return polled / settings.messaging.consumer.idle_poll_interval, polled


def _kind(statement: str) -> str:
    """``VERB table`` of an SQL statement, the table without its prefix."""
    verb = _VERB.match(statement).group(1).upper()  # type: ignore[union-attr]
    table = _TABLE.search(statement)
    name = table.group(1).removeprefix(PREFIX) if table else ""
    return f"{verb} {name}".strip()


def _print_counts(
    counts: Mapping[tuple[str, str], int], seconds: float, minimum: float, polled: int
) -> float:
    """Print per-second figures by (source, kind) and the ratio; return the total/s."""
    total = sum(counts.values()) / seconds
    queries = sum(n for (_, kind), n in counts.items() if kind.startswith(QUERIES)) / seconds
    print(
        f"  statements/s: {total:.2f}  (queries {queries:.2f}/s + transaction control, "
        f"pings, session set-up {total - queries:.2f}/s)"
    )
    for (source, kind), n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        print(f"    {n / seconds:8.2f}/s  {source:<32} {kind}")
    print(
        f"  minimum: {minimum:.2f}/s (one poll query per idle-poll-interval x {polled} consumers)"
    )
    print(f"  queries alone / minimum: {queries / minimum:.2f}")
    print(f"  ratio measured/minimum: {total / minimum:.2f}")
    return total


# -- SQLite: in process, counted on the engine ---------------------------------------------


class StatementCounter:
    """Counts the statements an engine executes, by (thread, statement kind)."""

    def __init__(self, engine: Engine) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.counting = False
        self._lock = threading.Lock()
        event.listen(engine, "before_cursor_execute", self._on_statement)
        event.listen(engine, "commit", lambda _conn: self._add("COMMIT"))
        event.listen(engine, "rollback", lambda _conn: self._add("ROLLBACK"))
        # Each new connection runs three PRAGMAs on the raw DBAPI connection.
        event.listen(engine, "connect", lambda *_: self._add("PRAGMA (new connection)", 3))
        # The pool's rollback on return is a no-op for pysqlite once the transaction
        # has ended (isolation_level=None: nothing is sent), so it is not counted.

    def _add(self, kind: str, n: int = 1) -> None:
        if self.counting:
            with self._lock:
                self.counts[(threading.current_thread().name, kind)] += n

    def _on_statement(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        self._add(_kind(statement))


def run_in_process(
    url: str, consumer: Mapping[str, Any], seconds: float, warmup: float
) -> Counter[tuple[str, str]]:
    """Run an idle instance here; return its statements over ``seconds`` by (thread, kind)."""
    settings = _settings(url, consumer)
    db = Database(url, table_prefix=PREFIX)
    counter = StatementCounter(db.engine)
    manager = create_plugin_manager([APP], load_entrypoints=False)
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="idle")
    instance.start()
    try:
        claimed = len(instance.workers["ledger-balances"].claims())
        assert claimed == PARTITIONS, f"the instance claimed {claimed} partitions"
        time.sleep(warmup)
        counter.counting = True
        time.sleep(seconds)
        counter.counting = False
    finally:
        instance.stop()
        db.dispose()
    return counter.counts


# -- MySQL: a real process, counted on the wire and on the server -------------------------


class WireCounter:
    """A TCP relay to a MySQL server that counts the commands clients send through it."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.counts: Counter[tuple[str, str]] = Counter()
        self.counting = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for target, args in (
                (self._commands, (client, server)),
                (self._copy, (server, client)),
            ):
                threading.Thread(target=target, args=args, daemon=True).start()

    @staticmethod
    def _copy(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                s.close()

    def _commands(self, client: socket.socket, server: socket.socket) -> None:
        """Relay the client's bytes; count each packet that starts a command (sequence 0)."""
        buffer = b""
        try:
            while data := client.recv(65536):
                server.sendall(data)
                buffer += data
                while len(buffer) >= 4:
                    length = int.from_bytes(buffer[:3], "little")
                    if len(buffer) < 4 + length:
                        break
                    sequence, payload = buffer[3], buffer[4 : 4 + length]
                    buffer = buffer[4 + length :]
                    if sequence == 0 and payload:
                        self._count(payload)
        except OSError:
            pass
        finally:
            for s in (client, server):
                s.close()

    def _count(self, payload: bytes) -> None:
        if not self.counting:
            return
        command = payload[0]
        if command == 0x03:  # COM_QUERY
            kind = _kind(payload[1:].decode("utf-8", "replace"))
        else:
            kind = _MYSQL_COMMANDS.get(command, f"command 0x{command:02x}")
        with self._lock:
            self.counts[("(wire)", kind)] += 1


class ServerStatus:
    """Server-wide statement counters of a MySQL/MariaDB server."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self.connection = self.engine.connect()

    def read(self) -> Counter[str]:
        names = ", ".join(f"'{n}'" for n in SERVER_COUNTERS)
        rows = self.connection.execute(
            text(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})")
        ).all()
        self.connection.commit()
        return Counter({str(name): int(value) for name, value in rows})

    def window(self, seconds: float) -> Counter[str]:
        before = self.read()
        time.sleep(seconds)
        after = self.read()
        return Counter({n: after[n] - before[n] for n in SERVER_COUNTERS})

    def close(self) -> None:
        self.connection.close()
        self.engine.dispose()


@contextmanager
def scratch_mysql(url: str) -> Iterator[str]:
    """A database of this run's own on the server of ``url``, migrated; dropped at the end."""
    parsed = make_url(url if "+" in url.split("://")[0] else url.replace("://", "+pymysql://", 1))
    name = f"prj_idle_{uuid.uuid4().hex[:10]}"
    engine = create_engine(parsed)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    try:
        scratch = parsed.set(database=name).render_as_string(hide_password=False)
        db = Database(scratch, table_prefix=PREFIX)
        migrate(db)
        db.dispose()
        yield scratch
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        engine.dispose()


def _config_file(directory: Path, url: str, consumer: Mapping[str, Any]) -> Path:
    lines = [f"database: {url}", f"table-prefix: {PREFIX}"]
    if consumer:
        lines += ["messaging:", "  consumer:"]
    for key, value in consumer.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k}: {v}" for k, v in value.items())
            lines.append(f"    {key}: {{{inner}}}")
        else:
            lines.append(f"    {key}: {value}")
    path = directory / f"idle-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _owned_by_one_instance(url: str) -> bool:
    db = Database(url, table_prefix=PREFIX, pool=False)
    try:
        parts, instances = db.schema.partitions, db.schema.instances
        with db.read() as conn:
            ids = set(conn.execute(select(instances.c.id)).scalars())
            owners = list(
                conn.execute(
                    select(parts.c.owner).where(parts.c.consumer == "ledger-balances")
                ).scalars()
            )
        return len(ids) == 1 and len(owners) == PARTITIONS and set(owners) == ids
    finally:
        db.dispose()


def run_process(
    url: str,
    consumer: Mapping[str, Any],
    seconds: float,
    warmup: float,
    relay: WireCounter,
    status: ServerStatus,
    directory: Path,
) -> tuple[Counter[tuple[str, str]], Counter[str]]:
    """Run ``projections run`` through ``relay``; return its commands over ``seconds`` and
    the server's counter deltas meanwhile."""
    relayed = make_url(url).set(host="127.0.0.1", port=relay.port)
    config = _config_file(directory, relayed.render_as_string(hide_password=False), consumer)
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "projections.cli", "--log-level", "WARNING", "run", APP),
            *("--config", str(config), "--instance-name", "idle"),
        ],
        env={**os.environ, "PYTHONPATH": SRC},
    )
    try:
        deadline = time.monotonic() + 60
        while not _owned_by_one_instance(url):  # directly, not through the relay
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the instance did not start and claim its partitions")
            time.sleep(0.2)
        time.sleep(warmup)
        relay.counts.clear()
        relay.counting = True
        server = status.window(seconds)
        relay.counting = False
        return Counter(relay.counts), server
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def _mysql(url: str, seconds: float, warmup: float, directory: Path) -> None:
    with scratch_mysql(url) as scratch:
        parsed = make_url(scratch)
        relay = WireCounter(parsed.host or "127.0.0.1", parsed.port or 3306)
        status = ServerStatus(scratch)
        try:
            idle = [status.window(seconds)]  # no instance running
            runs = []
            for label, consumer in CONFIGS.items():
                counts, server = run_process(
                    scratch, consumer, seconds, warmup, relay, status, directory
                )
                runs.append((label, consumer, counts, server))
                idle.append(status.window(seconds))
        finally:
            status.close()
            relay.close()
    for index, (label, consumer, counts, server) in enumerate(runs):
        minimum, polled = _minimum(consumer)
        print(f"\nmysql, {label}: `projections run` process, commands counted on the wire")
        measured = _print_counts(counts, seconds, minimum, polled)
        before, after = idle[index]["Questions"] / seconds, idle[index + 1]["Questions"] / seconds
        net = {n: (server[n] - (idle[index][n] + idle[index + 1][n]) / 2) / seconds for n in server}
        detail = ", ".join(f"{n} {net[n]:.2f}" for n in SERVER_COUNTERS[1:] if abs(net[n]) >= 0.005)
        print(
            f"  server side: Questions/s {net['Questions']:.2f} net of the idle server "
            f"({before:.2f}/s before, {after:.2f}/s after); {detail}"
        )
        # Questions leaves out COM_PING (MariaDB counts pings in Com_admin_commands only).
        expected = measured - sum(n for (_, k), n in counts.items() if k == "PING") / seconds
        if abs(net["Questions"] - expected) > max(1.0, 0.05 * expected):
            print(
                f"  (the server-side figure, expected {expected:.2f}/s without pings, was "
                "disturbed by other clients of the server)"
            )


# -- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="idle time before measuring")
    parser.add_argument("--mysql-url", help="also measure on this MySQL/MariaDB server")
    args = parser.parse_args(argv)
    seconds = args.seconds
    print(
        f"idle load of one instance of {APP} (ledger-balances: {PARTITIONS} partitions, all "
        f"owned; ledger-activity: in-memory), empty topic, {seconds:g} s per measurement"
    )
    with tempfile.TemporaryDirectory(prefix="idle-load-") as tmp:
        directory = Path(tmp)
        for label, consumer in CONFIGS.items():
            minimum, polled = _minimum(consumer)
            url = f"sqlite:///{directory}/{uuid.uuid4().hex[:6]}.db"
            print(f"\nsqlite, {label}: in-process instance, statements counted on the engine")
            counts = run_in_process(url, consumer, seconds, args.warmup)
            _print_counts(counts, seconds, minimum, polled)
        if args.mysql_url:
            _mysql(args.mysql_url, seconds, args.warmup, directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
