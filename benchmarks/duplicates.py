"""Repeated external effects after crashes: a route consumer's extra HTTP requests per SIGKILL.

Run as ``python benchmarks/duplicates.py [--mysql-url URL] [--messages N] [--delay-ms MS]
[--kills one,one,both] [--small-batch N] [--max-workers N]`` (``--help`` for the rest).
About 80 s on SQLite, 40 s more with MySQL (on a busy 2-core host).

**The claim.** Route consumers are at-least-once toward anything outside the database: a
batch in flight when its instance dies runs again elsewhere, so its external effects are
repeated. An instance applies its partitions in lanes (``executor.max-workers`` of them
on MySQL, one on SQLite) and a lane applies at most ``batch-size`` messages per
transaction, so one SIGKILLed instance repeats at most ``batch-size x lanes`` effects.

**The effect.** The route consumer ``http-out`` (``duplicates_app.py``, 16 partitions,
``idempotent=True``) POSTs each message it handles to an HTTP endpoint served by this
process (a ``ThreadingHTTPServer`` on 127.0.0.1), with the message's ``message-id`` as
its ``Idempotency-Key`` header and the instance's pid. The endpoint counts every request
per key as it arrives (a request whose sender dies while it is served still counts: the
remote side acted on it), then answers 200 after ``--delay-ms`` (10 ms: the remote
service's own time).

**Per configuration**, on a fresh database: two ``projections run`` instance processes
start and share the partitions; ``--messages`` (2,000) messages are sent to ``http-out``
in one transaction (``MessageStore.outgoing`` + ``append_encoded``: ``send``'s two steps).
At each ``k/(K+1)`` of the keys received (K kill events, ``--kills``, default
``one,one,both``) instances are SIGKILLed: ``one`` kills the instance whose request
arrived last (so the kill lands inside a batch it is applying), ``both`` kills both; each
is restarted at once under a new name. (On SQLite one batch is applied at a time, in the
write lock, so with the defaults the kills come on the last request of a full batch of
500: the worst case, the whole batch repeated.) The run ends when every key has been
received and the consumer's lag is 0 (every batch committed); the instances are then
stopped cleanly (SIGTERM, exit 0 required). The waits are on the endpoint's condition
variable (each new key notifies it) and on the lag query, never on sleeps.

**Figures.** ``requests``: what the endpoint received; ``distinct``: keys among them,
which must be the N message ids sent (none lost, none unknown); ``extra`` = requests -
distinct; ``extra/kill`` = extra / SIGKILLs; ``bound/kill`` = ``batch-size x lanes``,
read from the same config file the instances read (``lanes`` = 1 on SQLite,
``min(executor.max-workers, partitions)`` on MySQL). Each repeated request is attributed
to the instance that sent the key's previous request: one the benchmark killed (``per
kill event``: those of the event's victims beside ``batch-size x lanes x victims``), or
none (``other``: a repeat no kill explains, e.g. a retried batch). The benchmark checks
that ``extra <= bound/kill x SIGKILLs`` and that each event stays within its own bound,
and also that the idempotency guard recorded exactly N handled ids; it exits non-zero
when anything does not hold.

Configurations: the default ``messaging.consumer.batch-size`` (500, not set in the file)
and a small batch set for this consumer alone (``routing: {consumers: {http-out:
{batch-size: 10}}}``, ``--small-batch``), on SQLite (a temporary file) and, with
``--mysql-url``, on MySQL/MariaDB (``executor.max-workers`` ``--max-workers``, 8 by
default), in a scratch database created beside the given one and dropped at the end (or,
if it cannot be created, under unique table prefixes in the given one, dropped too).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from forked import Process

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Measure this checkout's code, in this process and in the instance processes.
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "support"), str(HERE)]

import attrs  # noqa: E402
import yaml  # noqa: E402
from clusters import kill_leftovers, start_instance, wait_until  # noqa: E402
from sqlalchemy import func, inspect, select, text  # noqa: E402

import bench_mysql  # noqa: E402
from duplicates_app import (  # noqa: E402
    DESTINATION,
    ENDPOINT_ENV,
    PARTITIONS,
    PATH,
    PID_HEADER,
    Request,
)
from messaging import Database, MessageStore, load_settings  # noqa: E402
from messaging._messages import registry  # noqa: E402
from messaging._settings import ConsumerSettings  # noqa: E402
from messaging.store._migrations import migrate  # noqa: E402
from projections._reports import consumers_report  # noqa: E402

APP = "duplicates_app"
INSTANCES = 2
CONSUMER_SETTINGS: dict[str, Any] = {
    "rebalance-interval": "1s",
    # The lock-wait bound is a quarter of it (15 s): on SQLite a batch holds the write lock
    # while its handlers call out (500 x 10 ms), and the other instance waits that long.
    # A SIGKILLed instance's liveness lock tells its peers at once; this only bounds freezes.
    "stale-instance-timeout": "60s",
    "heartbeat-interval": "1s",
    "idle-poll-interval": "50ms",
    "graceful-shutdown-timeout": "20s",
}
LOG_TAIL = 20


class BenchmarkFailure(Exception):
    """A key lost or unknown, an instance that died by itself, a step that never completed."""


# -- the remote service ------------------------------------------------------------------------


class Endpoint:
    """An HTTP endpoint on 127.0.0.1 that counts the requests of each ``Idempotency-Key``
    (and which instance sent them) and answers each after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.changed = threading.Condition()
        self.requests: dict[str, list[int]] = {}
        """Key → the pid of the sender of each of its requests, in arrival order."""
        self.last_pid = 0
        self.refused = 0
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.endpoint = self
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    def reset(self) -> None:
        with self.changed:
            self.requests = {}
            self.last_pid = 0
            self.refused = 0

    def record(self, key: str, pid: int) -> None:
        with self.changed:
            senders = self.requests.setdefault(key, [])
            senders.append(pid)
            self.last_pid = pid
            if len(senders) == 1:
                self.changed.notify_all()

    def wait_distinct(self, count: int, check: Callable[[], None], timeout: float) -> None:
        """Wait until ``count`` distinct keys arrived, calling ``check`` (which raises on a
        dead instance) at least every half second; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchmarkFailure(
                        f"timed out after {timeout:g}s waiting for {count} distinct keys "
                        f"(received {len(self.requests)})"
                    )
                self.changed.wait(min(left, 0.5))
                check()

    def snapshot(self) -> dict[str, list[int]]:
        with self.changed:
            return {key: list(senders) for key, senders in self.requests.items()}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # 16 lanes connecting at once must not overflow the backlog
    endpoint: Endpoint

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a killed instance's request: its answer has nowhere to go
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        assert isinstance(self.server, _Server)
        endpoint = self.server.endpoint
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        key = self.headers.get("Idempotency-Key")
        if self.path != PATH or not key:
            with endpoint.changed:
                endpoint.refused += 1
            self.send_error(400, "POST /effects with an Idempotency-Key")
            return
        endpoint.record(key, int(self.headers.get(PID_HEADER, "0")))
        time.sleep(endpoint.delay)  # the remote service's own time
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


# -- the instance processes --------------------------------------------------------------------


class Instances:
    """The ``projections run`` processes of one configuration, each logging to a file."""

    def __init__(self, config: Path, tmp: Path, endpoint: str, label: str) -> None:
        self.config, self.tmp, self.label = config, tmp, label
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        path = os.pathsep.join([str(ROOT / "src"), str(HERE), *inherited])
        self.env = {"PYTHONPATH": path, ENDPOINT_ENV: endpoint}
        self.live: dict[str, Process] = {}
        self.logs: dict[str, Path] = {}
        self._count = 0

    def start(self) -> str:
        self._count += 1
        name = f"{self.label}-{self._count}"
        self.logs[name] = self.tmp / f"{name}.log"
        self.live[name] = start_instance(self.config, name, APP, env=self.env, log=self.logs[name])
        return name

    def name_of(self, pid: int) -> str | None:
        return next((n for n, p in self.live.items() if p.pid == pid), None)

    def kill(self, names: Sequence[str]) -> list[int]:
        """SIGKILL ``names`` and wait for their end; their pids."""
        processes = [self.live.pop(name) for name in names]
        for process in processes:
            process.send_signal(signal.SIGKILL)
        for process in processes:
            process.wait()
        return [p.pid for p in processes]

    def check_alive(self) -> None:
        for name, process in self.live.items():
            if process.poll() is not None:
                raise BenchmarkFailure(
                    f"instance {name} died ({process.returncode}):\n{self.log_tail(name)}"
                )

    def stop_all(self) -> None:
        """SIGTERM every instance at once, then wait for each: all must exit 0."""
        for process in self.live.values():
            process.terminate()
        failed = []
        for name, process in self.live.items():
            try:
                code = process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                failed.append(f"{name} still ran 30 s after SIGTERM:\n{self.log_tail(name)}")
                continue  # SIGKILLed by kill_leftovers
            if code != 0:
                failed.append(f"{name} exited with {code} after SIGTERM:\n{self.log_tail(name)}")
        self.live.clear()
        if failed:
            raise BenchmarkFailure("\n".join(failed))

    def log_tail(self, name: str) -> str:
        lines = self.logs[name].read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(f"    {line}" for line in lines[-LOG_TAIL:])


# -- one configuration -------------------------------------------------------------------------


@attrs.define(kw_only=True)
class Result:
    backend: str
    batch: int
    lanes: int
    messages: int
    requests: int
    distinct: int
    lost: int
    unknown: int
    handled_ids: int
    events: list[tuple[int, int]]
    """Per kill event: (instances killed, repeats attributed to them)."""
    other: int
    """Repeats that follow a request of an instance not killed."""
    seconds: float

    @property
    def kills(self) -> int:
        return sum(victims for victims, _extra in self.events)

    @property
    def extra(self) -> int:
        return self.requests - self.distinct

    @property
    def bound(self) -> int:
        """Per SIGKILLed instance."""
        return self.batch * self.lanes

    def problems(self) -> list[str]:
        found = []
        if self.lost or self.unknown or self.distinct != self.messages:
            found.append(f"{self.lost} keys lost, {self.unknown} unknown")
        if self.handled_ids != self.messages:
            found.append(f"{self.handled_ids} handled ids recorded, not {self.messages}")
        if self.extra > self.bound * self.kills:
            found.append(f"extra {self.extra} > {self.bound} x {self.kills} kills")
        for n, (victims, extra) in enumerate(self.events, 1):
            if extra > self.bound * victims:
                found.append(f"kill event {n}: {extra} > {self.bound} x {victims}")
        return found


def write_config(path: Path, db: Database, batch: int | None, max_workers: int) -> Path:
    """The instances' config: ``batch`` set for ``http-out`` alone (None: the default)."""
    settings: dict[str, Any] = {
        "database": db.url,
        "table-prefix": db.schema.prefix,
        "messaging": {"consumer": {**CONSUMER_SETTINGS, "executor": {"max-workers": max_workers}}},
    }
    if batch is not None:
        settings["routing"] = {"consumers": {DESTINATION: {"batch-size": batch}}}
    path.write_text(yaml.safe_dump(settings, sort_keys=False), encoding="utf-8")
    return path


def send(db: Database, count: int) -> set[str]:
    """Send ``count`` requests to ``http-out`` in one transaction, each keyed by its message
    id (spread over the partitions); their message ids. (In one: on SQLite a later
    transaction would wait for the write lock behind the batch the first one started.)"""
    store = MessageStore(db, registry)
    ids = [uuid.uuid4().hex for _ in range(count)]
    messages = [
        store.outgoing(DESTINATION, Request(n), key=None, message_id=message_id)
        for n, message_id in enumerate(ids)
    ]
    with db.transaction() as conn:
        store.append_encoded(conn, messages)
    return set(ids)


def partitions(db: Database, settings: ConsumerSettings) -> list[dict[str, Any]]:
    for entry in consumers_report(db, settings, names=[DESTINATION])["consumers"]:
        if entry["name"] == DESTINATION:
            found: list[dict[str, Any]] = entry["partitions"]
            return found
    return []


def handled_ids(db: Database) -> int:
    p = db.schema.processed
    with db.read() as conn:
        query = select(func.count()).where(p.c.tenant == db.tenant, p.c.consumer == DESTINATION)
        return int(conn.execute(query).scalar_one())


def run_config(
    backend: str, db: Database, tmp: Path, endpoint: Endpoint, batch: int | None, args: Any
) -> Result:
    """The scenario of the module's docstring on ``db``, with ``batch`` for ``http-out``."""
    label = f"{backend}-{batch or 'default'}"
    config = write_config(tmp / f"{label}.yaml", db, batch, args.max_workers)
    loaded = load_settings(config)  # what the instances read, kinds' sections and all
    shared = loaded.messaging.consumer
    batch_size = loaded.group("routing").consumer_settings_for(DESTINATION, shared).batch_size
    lanes = 1 if db.is_sqlite else min(shared.executor.max_workers, PARTITIONS)
    endpoint.reset()
    instances = Instances(config, tmp, endpoint.address, label)
    events: list[list[int]] = []
    try:
        names = [instances.start() for _ in range(INSTANCES)]

        def shared_out() -> bool:
            instances.check_alive()
            owners = partitions(db, shared)
            return bool(owners) and {
                p["instance"] if p["state"] == "OWNED" else None for p in owners
            } == set(names)

        wait_until(shared_out, timeout=args.timeout, what=f"{names} to share the partitions")
        ids = send(db, args.messages)
        began = time.monotonic()
        for n, how in enumerate(args.kills, 1):
            endpoint.wait_distinct(
                args.messages * n // (len(args.kills) + 1), instances.check_alive, args.timeout
            )
            if how == "both":
                victims = list(instances.live)
            else:
                last = instances.name_of(endpoint.last_pid)
                victims = [last or next(iter(instances.live))]
            events.append(instances.kill(victims))
            for _ in victims:
                instances.start()
        endpoint.wait_distinct(args.messages, instances.check_alive, args.timeout)

        def committed() -> bool:
            instances.check_alive()
            owners = partitions(db, shared)
            return bool(owners) and sum(p["lag"] for p in owners) == 0

        wait_until(committed, timeout=args.timeout, what="every batch to be committed")
        seconds = time.monotonic() - began
        instances.stop_all()
    finally:
        kill_leftovers()
    requests = endpoint.snapshot()
    if endpoint.refused:
        raise BenchmarkFailure(f"{label}: the endpoint refused {endpoint.refused} requests")
    killed = {pid: n for n, pids in enumerate(events) for pid in pids}
    attributed = [0] * len(events)
    other = 0
    for senders in requests.values():
        for previous in senders[:-1]:  # each request after the first repeats this one's
            if previous in killed:
                attributed[killed[previous]] += 1
            else:
                other += 1
    return Result(
        backend=backend,
        batch=batch_size,
        lanes=lanes,
        messages=args.messages,
        requests=sum(len(s) for s in requests.values()),
        distinct=len(requests),
        lost=len(ids - requests.keys()),
        unknown=len(requests.keys() - ids),
        handled_ids=handled_ids(db),
        events=[(len(pids), extra) for pids, extra in zip(events, attributed, strict=True)],
        other=other,
        seconds=seconds,
    )


# -- databases ---------------------------------------------------------------------------------


@contextmanager
def sqlite_database(tmp: Path, name: str) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp / name}.db", table_prefix="dup_")
    try:
        db.prepare()
        yield db
    finally:
        db.dispose()


@contextmanager
def mysql_database(url: str) -> Iterator[Database]:
    """``url``'s database under a unique table prefix, migrated; its tables dropped after."""
    prefix = f"dup{uuid.uuid4().hex[:8]}_"
    db = Database(url, table_prefix=prefix)
    try:
        migrate(db)
        db.prepare()
        yield db
    finally:
        with db.engine.begin() as conn:
            for table in inspect(conn).get_table_names():
                if table.startswith(prefix):
                    conn.execute(text(f"DROP TABLE IF EXISTS `{table}`"))
        db.dispose()


# -- the report --------------------------------------------------------------------------------


def print_header(args: Any) -> None:
    kills = ", ".join(args.kills)
    count = sum(INSTANCES if how == "both" else 1 for how in args.kills)
    print(
        f"duplicates: route consumer {DESTINATION} ({PARTITIONS} partitions, idempotent) POSTing "
        f"each message with its message-id as Idempotency-Key; {args.messages} messages, "
        f"{INSTANCES} instances, endpoint delay {args.delay_ms:g} ms; kill events {kills} "
        f"({count} SIGKILLs, each at once restarted)"
    )
    print(
        "  extra = requests - distinct; bound/kill = batch x lanes; per kill event: repeats "
        "after a\n  victim's request / batch x lanes x victims; other: repeats no kill explains"
    )
    print(
        f"  {'backend':<7} {'batch':>5} {'lanes':>5} {'requests':>8} {'distinct':>8} "
        f"{'extra':>5} {'extra/kill':>10} {'bound/kill':>10} {'other':>5}  "
        f"{'per kill event':<26} {'time':>6}",
        flush=True,
    )


def print_row(result: Result) -> None:
    per_event = " ".join(f"{extra}/{result.bound * v}" for v, extra in result.events)
    per_kill = result.extra / result.kills if result.kills else 0.0
    problems = result.problems()
    verdict = "ok" if not problems else "FAILED: " + "; ".join(problems)
    print(
        f"  {result.backend:<7} {result.batch:>5} {result.lanes:>5} {result.requests:>8} "
        f"{result.distinct:>8} {result.extra:>5} {per_kill:>10.1f} {result.bound:>10} "
        f"{result.other:>5}  {per_event:<26} {result.seconds:>5.1f}s  {verdict}",
        flush=True,
    )


def run_backend(
    backend: str, open_db: Callable[[str], Any], tmp: Path, endpoint: Endpoint, args: Any
) -> list[Result]:
    results = []
    for batch in (None, args.small_batch):
        with open_db(f"{backend}-{batch or 'default'}") as db:
            results.append(run_config(backend, db, tmp, endpoint, batch, args))
        print_row(results[-1])
    return results


def kill_plan(value: str) -> list[str]:
    plan = [part.strip() for part in value.split(",") if part.strip()]
    if not plan or any(part not in ("one", "both") for part in plan):
        raise argparse.ArgumentTypeError("a comma-separated list of 'one' and 'both'")
    return plan


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mysql-url", help="also benchmark on MySQL/MariaDB at this URL")
    parser.add_argument("--messages", type=int, default=2_000, help="sent per config (2000)")
    parser.add_argument(
        "--delay-ms", type=float, default=10.0, help="the endpoint's time per request (10)"
    )
    parser.add_argument(
        "--kills", type=kill_plan, default=["one", "one", "both"], help="one,one,both"
    )
    parser.add_argument(
        "--small-batch", type=int, default=10, help="http-out's own batch-size, second (10)"
    )
    parser.add_argument(
        "--max-workers", type=int, default=8, help="executor.max-workers: MySQL's lanes (8)"
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per wait (180)")
    args = parser.parse_args(argv)
    if args.messages < len(args.kills) + 1 or args.small_batch < 1 or args.max_workers < 1:
        parser.error("--messages must exceed the kill events; batch and workers at least 1")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up on SIGTERM too
    endpoint = Endpoint(args.delay_ms / 1000)
    results: list[Result] = []
    try:
        with tempfile.TemporaryDirectory(prefix="duplicates-") as tmp_dir:
            tmp = Path(tmp_dir)
            print_header(args)
            results += run_backend(
                "sqlite", lambda name: sqlite_database(tmp, name), tmp, endpoint, args
            )
            if args.mysql_url:
                with bench_mysql.scratch_database(args.mysql_url, "duplicates") as url:
                    open_mysql = lambda _name: mysql_database(url)  # noqa: E731
                    results += run_backend("mysql", open_mysql, tmp, endpoint, args)
    except (BenchmarkFailure, AssertionError) as exc:
        print(f"BENCHMARK FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        endpoint.close()
    failed = [r for r in results if r.problems()]
    held = "held" if not failed else f"did NOT hold in {len(failed)} configuration(s)"
    print(f"bound extra/kill <= batch x lanes (and per kill event): {held}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
