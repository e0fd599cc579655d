"""``projections demo``: the ledger example end to end, with a crash, a join and a clean stop.

Writes realistic traffic (with transfer requests for the transfer saga) while instance
processes of the example app apply it. Once
about a third is applied it SIGKILLs one instance and shows the survivors take over its
partitions, starts a replacement, then stops one instance with SIGTERM, timing each
handover against its bound. Finally it waits for every transfer saga to end, stops
every instance gracefully, checks the read model against a sequential replay of every
message and the transfers against a sequential model, and prints a summary.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from sqlalchemy import func, select

from messaging import ConfigError, ConsumerSettings, Database, MessageStore
from messaging.operations import OwnerState, parse_database_url, registry, settings_from_mapping
from projections._demo_console import Console, View
from projections._demo_probe import BATCHES_ENV, longest_batch
from projections._reports import consumers_report, instances_report
from projections.examples import ledger, transfers

DEMO_CONFIG = """\
messaging:
  consumer:
    rebalance-interval: 1s
    stale-instance-timeout: 3s
    heartbeat-interval: 500ms
    graceful-shutdown-timeout: 5s
    idle-poll-interval: 100ms
    batch-size: 200
    conflict-retry: {max-retries: 5, max-delay: 200ms}
"""
WATCHED = "ledger-balances"
"""The consumer whose partitions the demo shows moving."""
POLL = 0.05
"""Seconds between two looks at the reports while waiting for something."""
TIMEOUT = 60.0
"""Seconds any one step may take before the demo gives up."""


class DemoFailed(Exception):
    """A step of the demo went wrong: an instance died, a wait timed out, a write failed."""


def _fresh_sqlite(url: str) -> Path:
    parsed = parse_database_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        raise ConfigError("demo: --database must be a SQLite file URL (sqlite:///demo.db)")
    path = Path(parsed.database)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


class Demo:
    """The instance processes, the traffic writer and the waits between them."""

    def __init__(
        self,
        db: Database,
        settings: ConsumerSettings,
        command: Sequence[str],
        *,
        messages: int,
        seed: int,
    ) -> None:
        self.db = db
        self.settings = settings
        self.command = list(command)
        self.messages = messages
        self.seed = seed
        self.console = Console()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.expected_exit: set[str] = set()  # killed or stopped on purpose
        self.killed: str | None = None
        self.written = 0
        """Ledger messages written (the balances projection's share of the traffic)."""
        self.transfers: list[object] = []
        """The transfer traffic written, for the saga's sequential model."""
        self._stop_writing = threading.Event()
        self._write_error: BaseException | None = None
        self.writer = threading.Thread(target=self._write, daemon=True)

    def _write(self) -> None:
        """Ledger traffic, with a transfer request for the saga every tenth command."""
        store = MessageStore(self.db)
        requests = transfers.traffic(self.seed, max(10, self.messages // 50))
        try:
            for number, command in enumerate(ledger.traffic(self.seed, self.messages)):
                if self._stop_writing.is_set():
                    return
                with self.db.transaction() as conn:
                    for source, event in command:
                        store.append(conn, ledger.TOPIC, source, [event])
                self.written += len(command)
                if number % 10 == 0:
                    self._write_transfer(store, next(requests, []))
            for request in requests:
                self._write_transfer(store, request)
        except BaseException as exc:  # reported by the next wait
            self._write_error = exc

    def _write_transfer(self, store: MessageStore, command: list[tuple[str, str, object]]) -> None:
        with self.db.transaction() as conn:
            for topic, source, event in command:
                store.append(conn, topic, source, [event])
        self.transfers.extend(event for _, _, event in command)

    def transfers_settled(self) -> bool:
        """Every transfer requested has ended and every consumer has caught up."""
        requested = sum(isinstance(m, transfers.TransferRequested) for m in self.transfers)
        table = self.db.schema.sagas
        with self.db.read() as conn:
            ended = conn.execute(
                select(func.count()).where(table.c.tenant == self.db.tenant, table.c.ended)
            ).scalar_one()
        report = consumers_report(self.db, self.settings)
        lag = sum(p["lag"] for c in report["consumers"] for p in c["partitions"])
        return bool(ended == requested and lag == 0)

    def start(self, name: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [*self.command, "--instance-name", name],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.processes[name] = process
        return process

    def view(self) -> View:
        written, writing = self.written, self.writer.is_alive()
        report = consumers_report(self.db, self.settings)
        live = instances_report(self.db, self.settings)["instances"]
        partitions = [
            p for c in report["consumers"] if c["name"] == WATCHED for p in c["partitions"]
        ]
        states = Counter(p["state"] for p in partitions)
        return View(
            written=written,
            writing=writing,
            lag=sum(p["lag"] for p in partitions) if partitions else written,
            owned=Counter(p["instance"] for p in partitions if p["state"] == OwnerState.OWNED),
            orphaned=states[OwnerState.ORPHANED],
            unclaimed=states[OwnerState.UNCLAIMED],
            live=frozenset(i["name"] for i in live if i["live"]),
        )

    def wait_for(self, condition: Callable[[View], bool], what: str) -> tuple[float, View]:
        """Show the cluster until ``condition`` holds; return when it was seen to, and the view."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            looked = time.monotonic()
            view = self.view()
            self.console.status(view, self.killed)
            if condition(view):
                return looked, view
            for name, process in self.processes.items():
                if name not in self.expected_exit and process.poll() is not None:
                    raise DemoFailed(f"instance {name} exited unexpectedly ({process.returncode})")
            if self._write_error is not None:
                raise DemoFailed(f"writing traffic failed: {self._write_error!r}")
            if looked > deadline:
                raise DemoFailed(f"gave up after {TIMEOUT:.0f}s waiting for {what}")
            time.sleep(POLL)

    def stop(self, name: str) -> int:
        """SIGTERM an instance and wait for its exit code."""
        self.expected_exit.add(name)
        process = self.processes[name]
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout=self.settings.graceful_shutdown_timeout + 10)

    def shutdown(self) -> None:
        """Stop whatever still runs (after a failure)."""
        self._stop_writing.set()
        for name, process in self.processes.items():
            if process.poll() is None:
                try:
                    self.stop(name)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def run_demo(*, database: str, messages: int, workers: int, seed: int) -> int:
    """Run the demo; return 0 when the read model equals the sequential replay."""
    if workers < 2:
        raise ConfigError("demo: --workers must be at least 2 (one of them is killed)")
    path = _fresh_sqlite(database)
    settings = settings_from_mapping(yaml.safe_load(DEMO_CONFIG)).messaging.consumer
    db = Database(database)
    db.prepare()
    with tempfile.TemporaryDirectory(prefix="projections-demo-") as tmp:
        config = Path(tmp) / "demo.yaml"
        config.write_text(DEMO_CONFIG, encoding="utf-8")
        command = [sys.executable, "-m", "projections.cli", "--log-level", "WARNING", "run"]
        command += ["projections.examples.ledger", "projections.examples.transfers"]
        command += ["projections._demo_probe"]
        batches = str(Path(tmp) / "batches.txt")
        os.environ[BATCHES_ENV] = batches
        command += ["--database", database, "--config", str(config)]
        demo = Demo(db, settings, command, messages=messages, seed=seed)
        print(f"demo database: {path.resolve()}")
        try:
            times = _scenario(demo, workers)
        except DemoFailed as exc:
            demo.console.say(f"FAILED: {exc}")
            db.dispose()
            return 1
        finally:
            demo.shutdown()
            os.environ.pop(BATCHES_ENV, None)
        over = _summary(settings, times, longest_batch(batches))
    verified = _verify(db, demo.written, demo.transfers)
    if over:
        print(f"OVER: {over} handover(s) took longer than their bound", file=sys.stderr)
    return verified or (1 if over else 0)


def _scenario(demo: Demo, workers: int) -> dict[str, float]:
    """Crash, join and clean stop under traffic; return the measured times."""
    s = demo.settings
    names = [f"demo-{i}" for i in range(1, workers + 1)]
    demo.console.say(
        f"starting {workers} instances of projections.examples.ledger ({', '.join(names)}): "
        f"rebalance-interval {s.rebalance_interval:g}s, stale-instance-timeout "
        f"{s.stale_instance_timeout:g}s, heartbeat-interval {s.heartbeat_interval:g}s"
    )
    for name in names:
        demo.start(name)
    demo.console.say(f"writing {demo.messages} messages of ledger traffic")
    demo.writer.start()
    _, view = demo.wait_for(
        lambda v: v.balanced_over(names) and v.applied >= demo.messages // 3,
        "every instance to own partitions and a third of the traffic to be applied",
    )
    victim = max(names, key=lambda n: view.owned[n])
    survivors = [n for n in names if n != victim]
    times = {"crash": _crash(demo, victim, view.owned[victim], survivors)}
    joiner = f"demo-{workers + 1}"
    times["join"], times["startup"] = _join(demo, joiner, [*survivors, joiner])
    remaining = [*survivors[1:], joiner]
    times["stop"] = _clean_stop(demo, survivors[0], remaining)

    demo.wait_for(lambda v: not v.writing and v.lag == 0, "the lag to reach 0")
    demo.console.say(f"all {demo.written} ledger messages applied")
    demo.wait_for(
        lambda _: demo.transfers_settled(),
        "every transfer saga to end (refunds wait for their deadline)",
    )
    demo.console.say(f"every transfer saga has ended; SIGTERM {', '.join(remaining)}")
    codes = {name: demo.stop(name) for name in remaining}
    if any(codes.values()):
        raise DemoFailed(f"instances did not stop cleanly: exit codes {codes}")
    demo.console.say("every instance exited with 0")
    return times


def _crash(demo: Demo, victim: str, owned: int, survivors: list[str]) -> float:
    """SIGKILL ``victim``; seconds until the survivors own every partition."""
    s = demo.settings
    killed = time.monotonic()
    demo.expected_exit.add(victim)
    demo.processes[victim].kill()
    demo.processes[victim].wait()
    demo.killed = victim
    demo.console.say(f"SIGKILL {victim}, which owns {owned} partitions")
    seen, _ = demo.wait_for(lambda v: v.owned_by(survivors), f"survivors to take over {victim}")
    crash = seen - killed
    demo.console.say(
        f"crash handover: {crash:.2f}s from the kill until survivors own every partition "
        f"(bound {s.stale_instance_timeout + s.rebalance_interval:.2f}s "
        f"= stale-instance-timeout + rebalance-interval)"
    )
    return crash


def _join(demo: Demo, joiner: str, members: list[str]) -> tuple[float, float]:
    """Start ``joiner``; seconds until it owns its share, and of them its start-up."""
    launched = time.monotonic()
    demo.start(joiner)
    demo.console.say(f"starting replacement {joiner}")
    registered, _ = demo.wait_for(lambda v: joiner in v.live, f"{joiner} to register")
    seen, _ = demo.wait_for(lambda v: v.balanced_over(members), f"{joiner} to own its share")
    join, startup = seen - registered, registered - launched
    demo.console.say(
        f"join handover: {join:.2f}s from its registration until {joiner} owns its share "
        f"(bound {2 * demo.settings.rebalance_interval:.2f}s = 2 x rebalance-interval, + one "
        f"batch); its process start-up before that took {startup:.2f}s"
    )
    return join, startup


def _clean_stop(demo: Demo, leaver: str, remaining: list[str]) -> float:
    """SIGTERM ``leaver``; seconds from its exit until the others own every partition."""
    # A random moment, not in step with the rebalance loops' beat.
    pause = time.monotonic() + random.uniform(0, demo.settings.rebalance_interval)
    demo.wait_for(lambda v: time.monotonic() >= pause, "a moment")
    demo.console.say(f"SIGTERM {leaver}")
    asked = time.monotonic()
    demo.expected_exit.add(leaver)
    demo.processes[leaver].send_signal(signal.SIGTERM)
    # Its row goes in the transaction that releases its partitions: that is the release.
    released, _ = demo.wait_for(lambda v: leaver not in v.live, f"{leaver} to release")
    seen, _ = demo.wait_for(lambda v: v.owned_by(remaining), f"others to take over {leaver}")
    code = demo.processes[leaver].wait(timeout=demo.settings.graceful_shutdown_timeout + 10)
    if code != 0:
        raise DemoFailed(f"{leaver} exited with {code} after SIGTERM")
    stop = seen - released
    demo.console.say(
        f"{leaver} released its partitions {released - asked:.2f}s after SIGTERM and exited"
    )
    demo.console.say(
        f"clean-stop handover: {stop:.2f}s from its release until others own every partition "
        f"(bound {demo.settings.rebalance_interval:.2f}s = rebalance-interval, + one batch)"
    )
    return stop


def _summary(s: ConsumerSettings, times: dict[str, float], batch: float) -> int:
    """Print each handover beside its bound, saying what both include; return how many
    rows are over their bound."""
    rebalance = s.rebalance_interval
    rows = [
        (
            "crash",
            times["crash"],
            s.stale_instance_timeout + rebalance,
            "SIGKILL -> survivors own all; bound stale + rebalance",
        ),
        (
            "join",
            times["join"],
            2 * rebalance + batch,
            f"registered -> owns its share; bound 2 x rebalance + one batch ({batch:.3f}s, the "
            f"longest seen); start-up ({times['startup']:.2f}s) not included",
        ),
        (
            "clean stop",
            times["stop"],
            rebalance + batch,
            "release -> others own all; bound rebalance + one batch (a claim waits for the "
            "batch holding SQLite's write lock)",
        ),
    ]
    print()
    print(f"handovers, each seen by looking at the reports every {POLL * 1000:.0f} ms:")
    print(f"{'handover':<12} {'measured':>8}  {'bound':>6}  what is measured and bounded")
    over = 0
    for label, measured, bound, why in rows:
        mark = "  OVER ITS BOUND" if measured > bound else ""
        over += measured > bound
        print(f"{label:<12} {measured:>7.2f}s  {bound:>5.2f}s  {why}{mark}")
    return over


def _verify(db: Database, written: int, transfer_traffic: list[object]) -> int:
    """The balances against a sequential replay of every ledger event, and the transfer
    accounts' balances against a sequential model of the transfer traffic."""
    m = db.schema.messages
    with db.read() as conn:
        rows = conn.execute(select(m.c.type, m.c.payload).order_by(m.c.position)).all()
        stored = conn.execute(select(ledger.balances)).mappings().all()
        notified = conn.execute(select(func.count()).select_from(transfers.notifications))
        notifications = int(notified.scalar_one())
    events = [registry.decode(t, p) for t, p in rows]
    expected = ledger.replay(events)
    actual = ledger.read_model(stored)
    model = transfers.model(transfer_traffic)
    db.dispose()
    requested = sum(isinstance(e, transfers.TransferRequested) for e in transfer_traffic)
    refunded = sum(isinstance(e, ledger.TransferRefunded) for e in events)
    failures = []
    if actual != expected:
        wrong = sorted(
            k for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k)
        )
        failures.append(f"{len(wrong)} accounts differ from the replay, e.g. {wrong[:5]}")
    wrong = sorted(k for k in model if model[k] != actual.get(k))
    if wrong:
        failures.append(f"{len(wrong)} accounts differ from the transfer model, e.g. {wrong[:5]}")
    if notifications != requested:
        failures.append(f"{notifications} notifications for {requested} transfers")
    if failures:
        print("MISMATCH: " + "; ".join(failures), file=sys.stderr)
        return 1
    money = sum(balance for _, balance, _ in actual.values())
    print(
        f"OK: read model equals a sequential replay of {written} ledger messages and "
        f"{len(events) - written} saga-made ones ({len(actual)} accounts, total balance {money})"
    )
    print(
        f"OK: {requested} transfer sagas ended as a sequential model says: "
        f"{requested - refunded} credited, {refunded} refunded at their deadline, "
        f"one notification each"
    )
    return 0
