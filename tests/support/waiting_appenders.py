"""Appenders that wait to read their own writes, on real instance processes: the body of
tests/integration/test_read_your_writes_cluster.py (SQLite, MariaDB) and
tests/galera/test_waits_galera.py.

Each appender thread deposits to five accounts of its own, a transaction a round: one in
eight rolls back, one in four holds the tenant's position counter a few ms so that the
others queue behind it (appends commit in position order: the counter's lock is held to
the commit). It then waits on the append's token and reads the account on a new
connection, where :class:`Places` says (on Galera: appended through one node, waited on and
read through others). One wait in ten is impatient (0.02-0.3 s, at once): it applies or
raises ``WaitTimeout`` naming the append's position. Every timeout's overshoot is kept (as
``WaitTimeout.waited`` says and as a clock around ``wait_for`` measures); one that ends
before its timeout is a failure. A false applied (the read shows fewer entries than were
written) is diagnosed on the spot (:func:`ryw_reads.diagnose`). Meanwhile :func:`run` disrupts
the instances every ``disrupt_every`` applied waits (:class:`instance_fleet.Fleet`) and
requests one rebuild midway; :func:`check` then wants every account to hold exactly the
deposits that committed and prints a summary line.

Sizes come from the environment (:meth:`Plan.from_env`); the defaults keep CI short.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import traceback
from collections import Counter
from datetime import datetime
from functools import partial

import attrs
from clusters import lag, live_version, owned_by, wait_until
from instance_fleet import Fleet
from ledger_waits import CONSUMER
from ryw_reads import Reading, diagnose

from messaging import (
    Behind,
    ConflictRetrySettings,
    Database,
    MessageStore,
    Progress,
    WaitRefused,
    WaitTimeout,
    wait_for,
)
from messaging.store._retry import lock_conflict, retry_transient
from messaging.store._tokens import Appended
from messaging.waits._progress import UNCOMMITTED
from projections.examples import ledger

ROLLS_BACK = 0.125
HOLDS = 0.25
IMPATIENT = 0.1
IMPATIENCE = (0.02, 0.3)
"""The timeouts of an impatient wait, drawn uniformly (seconds)."""
ROLLED_BACK_TIMEOUT = 0.2
PATIENCE = 30.0
"""The timeout of any other wait: one that runs out is a failure."""
STALLED = 120.0
"""Seconds without a wait ending that fail the run."""
NO_ANSWER = "the database did not answer"
"""What a timeout names when its last check failed (a transient error)."""


def _env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


@attrs.frozen
class Plan:
    """How big a run is: ``appenders`` threads of ``rounds`` waits each, a disruption every
    ``disrupt_every`` applied waits (0: none), the bound on a timeout's overshoot (the
    suite's default allows for a CI machine running other tests beside the instances: a
    thread there once waited 280 ms for a core; the acceptance runs ask 50)."""

    appenders: int = 4
    rounds: int = 150
    disrupt_every: int = 100
    overshoot_ms: int = 500

    @classmethod
    def from_env(cls) -> Plan:
        """The plan of ``PROJECTIONS_RYW_APPENDERS``, ``_ROUNDS``, ``_DISRUPT_EVERY`` and
        ``_OVERSHOOT_MS`` (each unset: the default)."""
        default = cls()
        return cls(
            _env("PROJECTIONS_RYW_APPENDERS", default.appenders),
            _env("PROJECTIONS_RYW_ROUNDS", default.rounds),
            _env("PROJECTIONS_RYW_DISRUPT_EVERY", default.disrupt_every),
            _env("PROJECTIONS_RYW_OVERSHOOT_MS", default.overshoot_ms),
        )

    @property
    def waits(self) -> int:
        return self.appenders * self.rounds


@attrs.frozen
class Places:
    """Where appenders write (``writer``), wait (``waiter``) and read after an applied
    wait (each of ``readings``, the first on the waiter's node)."""

    writer: Database
    waiter: Database
    readings: tuple[Reading, ...]


class Tally:
    """What the appenders saw, shared between their threads and the driver."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.outcomes: Counter[str] = Counter()
        self.committed: Counter[str] = Counter()
        """Account → deposits committed."""
        self.overshoots: list[tuple[float, float, str]] = []
        """Per timeout, seconds past it (as ``WaitTimeout.waited`` says, as measured) and
        which wait it was, when."""
        self.failures: list[str] = []
        self.false_applied: list[str] = []
        self.finished = 0
        self.halt = threading.Event()
        self.rebuild_at: int | None = None
        self.cutover_at: int | None = None
        """Waits ended when the rebuild was requested, and when the new version was live."""

    @property
    def waits(self) -> int:
        return sum(self.outcomes.values())

    def count(self, outcome: str) -> None:
        with self.changed:
            self.outcomes[outcome] += 1
            self.changed.notify_all()

    def deposited(self, account: str) -> None:
        with self.changed:
            self.committed[account] += 1

    def fail(self, text: str) -> None:
        with self.changed:
            self.failures.append(text)

    def timed_out(self, timeout: float, exc: WaitTimeout, wall: float, kind: str) -> None:
        """Keep a timeout's overshoot; one whose wall time is short of it is a failure."""
        at = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        with self.changed:
            self.overshoots.append((exc.waited - timeout, wall - timeout, f"{kind} at {at}"))
            if wall < timeout:
                self.failures.append(f"a wait of {timeout:.3f}s timed out after {wall:.4f}s")

    def finish(self) -> None:
        with self.changed:
            self.finished += 1
            self.changed.notify_all()

    def summary(self, label: str, wall: float) -> str:
        """The run in one line."""
        o = self.outcomes
        timed_out = sum(n for k, n in o.items() if "timed out" in k or "WaitTimeout" in k)
        refused = sum(n for k, n in o.items() if "refused" in k or "WaitRefused" in k)
        reported = sorted(x[0] * 1000 for x in self.overshoots)
        measured = sorted(x[1] * 1000 for x in self.overshoots)
        worst = sorted(self.overshoots, key=lambda x: -x[1])[:3]
        return (
            f"read-your-writes {label}: waits {self.waits}, applied {o['applied']}, "
            f"timed out {timed_out}, refused {refused}, "
            f"false applied {len(self.false_applied)}, overshoot ms p50/p99/max "
            f"{_quantiles(measured)} measured, {_quantiles(reported)} reported, "
            f"wall {wall:.1f}s\n  the worst overshoots: "
            + ", ".join(f"{x[1] * 1000:.0f} ms ({x[2]})" for x in worst)
        )


def _quantiles(values: list[float]) -> str:
    if not values:
        return "-/-/-"
    picks = [values[int(q * (len(values) - 1))] for q in (0.5, 0.99)] + [values[-1]]
    return "/".join(f"{v:.0f}" for v in picks)


class _Abort(Exception):
    """Rolls an append back."""


class Appender(threading.Thread):
    """Deposits ``plan.rounds`` times, waiting after each for the read model to show it."""

    def __init__(self, number: int, plan: Plan, places: Places, tally: Tally) -> None:
        super().__init__(name=f"appender-{number}", daemon=True)
        self.number, self.plan, self.places, self.tally = number, plan, places, tally
        self.rng = random.Random(number)
        self.store = MessageStore(places.writer)
        self.written: Counter[str] = Counter()

    def run(self) -> None:
        try:
            for round_ in range(self.plan.rounds):
                if self.tally.halt.is_set():
                    return
                self.round(round_)
        except BaseException:  # reported by the test
            self.tally.fail(f"{self.name} crashed: {traceback.format_exc()}")
        finally:
            self.tally.finish()

    def round(self, round_: int) -> None:
        rng = self.rng
        account = f"w{self.number}-{rng.randrange(5)}"
        rolls_back = rng.random() < ROLLS_BACK
        hold = rng.uniform(0.001, 0.02) if rng.random() < HOLDS else 0.0
        impatient = rng.random() < IMPATIENT
        source = f"{account}-{round_}" if rolls_back else account
        appended = self.append(account, source, hold, rolls_back)
        if rolls_back:
            self.wait(appended, ROLLED_BACK_TIMEOUT, "rolled back")
            return
        self.written[account] += 1
        self.tally.deposited(account)
        kind, timeout = (
            ("impatient", rng.uniform(*IMPATIENCE)) if impatient else ("patient", PATIENCE)
        )
        started = time.monotonic()
        progress = self.wait(appended, timeout, kind)
        if progress is not None:
            self.read(account, appended, progress, time.monotonic() - started)

    def append(self, account: str, source: str, hold: float, rolls_back: bool) -> Appended:
        """One deposit in a transaction of its own (a lock conflict retried, as an
        application does); its positions and token."""
        made: list[Appended] = []

        def attempt() -> None:
            with self.places.writer.transaction() as conn:
                topic = "void" if rolls_back else ledger.TOPIC
                made[:] = [self.store.append(conn, topic, source, [ledger.Deposited(account, 1)])]
                if hold:  # holds the counter: appenders behind it queue up
                    time.sleep(hold)
                if rolls_back:
                    raise _Abort

        with contextlib.suppress(_Abort):
            retry_transient(
                attempt,
                ConflictRetrySettings(max_retries=20),
                what="append",
                give_up=lambda exc: lock_conflict(exc) is None,
            )
        return made[0]

    def wait(self, appended: Appended, timeout: float, kind: str) -> Progress | None:
        """Wait on ``appended`` and count how it ended; the progress when applied."""
        position = appended[-1]
        started = time.monotonic()
        try:
            progress = wait_for(self.places.waiter, appended.token, CONSUMER, timeout=timeout)
        except WaitTimeout as exc:
            self.tally.timed_out(timeout, exc, time.monotonic() - started, kind)
            self._timed_out(exc, position, kind)
            return None
        except WaitRefused as exc:
            if kind == "rolled back":
                self.tally.count("rolled back: refused")
                if f"position {position} holds no message of topic 'void'" not in str(exc):
                    self.tally.fail(f"a rolled-back append refused for another reason: {exc}")
            else:
                self.tally.count("not applied: WaitRefused")
                self.tally.fail(f"a committed append at {position} was refused: {exc}")
            return None
        if kind == "rolled back":
            self.tally.count("rolled back: applied")
            self.tally.fail(f"a rolled-back append at {position} answered applied: {progress}")
            return None
        return progress

    def _timed_out(self, exc: WaitTimeout, position: int, kind: str) -> None:
        """Count a timeout; its text must name what is behind the append."""
        if kind == "rolled back":
            named = f"position {position} is {UNCOMMITTED}" in str(exc)
        else:
            named = any(isinstance(b, Behind) and b.position == position for b in exc.behind)
        if not named and NO_ANSWER in str(exc):
            self.tally.count(f"{kind}: timed out, {NO_ANSWER}")
        else:
            self.tally.count(f"{kind}: timed out")
        if not named and NO_ANSWER not in str(exc):
            self.tally.fail(f"a timeout of an append at {position} names another reason: {exc}")
        elif kind == "patient":
            self.tally.fail(f"a committed append at {position} not applied: {exc}")

    def read(self, account: str, appended: Appended, progress: Progress, waited: float) -> None:
        """After an applied wait, each reading must show every deposit written."""
        written = self.written[account]
        for reading in self.places.readings:
            seen = reading.entries(account)
            if seen < written:
                found = diagnose(
                    self.places.waiter, reading, account, seen, written, appended, progress, waited
                )
                with self.tally.changed:
                    self.tally.false_applied.append(found)
            elif seen > written:
                self.tally.fail(f"{account} shows {seen} entries on {reading.name}: {written} made")
        self.tally.count("applied")


def run(plan: Plan, places: Places, fleet: Fleet) -> tuple[Tally, float]:
    """Start two instances, then the appenders; disrupt the instances every
    ``plan.disrupt_every`` applied waits and request a rebuild midway; the tally and the
    seconds the appenders took. Every instance is stopped (or was killed) at the end."""
    tally = Tally()
    try:
        fleet.start()
        fleet.start()
        wait_until(
            lambda: owned_by(places.writer, set(fleet.running)), timeout=60, what="two to share"
        )
        appenders = [Appender(n, plan, places, tally) for n in range(plan.appenders)]
        started = time.monotonic()
        for appender in appenders:
            appender.start()
        try:
            _drive(plan, places, fleet, tally)
        finally:
            tally.halt.set()  # ends them early only when the driver did (a failure)
            for appender in appenders:
                appender.join(PATIENCE * 2)
        wall = time.monotonic() - started
        assert not any(a.is_alive() for a in appenders), "an appender never ended"
        wait_until(lambda: live_version(places.writer) == 2, timeout=60, what="the rebuild")
        wait_until(lambda: lag(places.writer) == 0, timeout=60, what="the last messages")
    finally:
        tally.halt.set()
        fleet.stop_all()
    return tally, wall


def _drive(plan: Plan, places: Places, fleet: Fleet, tally: Tally) -> None:
    """Disrupt the fleet in turn, request the rebuild midway and note when its version
    went live, until every appender has finished."""
    every = plan.disrupt_every
    next_at, turn, looked = every or None, 0, 0.0
    while True:
        with tally.changed:
            ended = tally.changed.wait_for(
                partial(_moved, tally, tally.waits, plan.appenders), STALLED
            )
            waits, applied = tally.waits, tally.outcomes["applied"]
            if tally.finished == plan.appenders:
                return
        if not ended:
            tally.fail(f"stalled: no wait ended for {STALLED:.0f}s after {waits}")
            tally.halt.set()
            return
        if tally.rebuild_at is None:
            if waits >= plan.waits // 2:
                fleet.rebuild()
                tally.rebuild_at = waits
        elif tally.cutover_at is None and time.monotonic() - looked > 0.5:
            looked = time.monotonic()
            if live_version(places.writer) == 2:
                tally.cutover_at = waits
        if next_at is not None and applied >= next_at:
            fleet.disrupt(turn)
            turn, next_at = turn + 1, next_at + every


def _moved(tally: Tally, waits: int, appenders: int) -> bool:
    """Whether a wait ended since there were ``waits``, or every appender finished."""
    return tally.waits != waits or tally.finished == appenders


def check(plan: Plan, places: Places, fleet: Fleet, tally: Tally, wall: float, label: str) -> None:
    """Every wait ended, none falsely applied, every account holds exactly the deposits
    that committed on every reading, no timeout overshot ``plan.overshoot_ms`` (checked
    last: the others are worth knowing first); prints the summary line."""
    summary = f"{tally.summary(label, wall)}\n  instances: {fleet.summary()}"
    print(f"\n{summary}")
    context = f"{summary}\n  their logs in {fleet.logs}"
    assert not tally.false_applied, "\n".join([context, *tally.false_applied[:5]])
    assert not tally.failures, "\n".join([context, *tally.failures[:10]])
    assert tally.waits == plan.waits, (context, tally.outcomes)
    assert tally.outcomes["rolled back: refused"] + tally.outcomes["rolled back: timed out"] > 0
    assert all(code == 0 for code in fleet.exits.values()), fleet.exits
    assert tally.rebuild_at is not None and tally.cutover_at is not None, context
    committed = dict(tally.committed)
    for reading in (*places.readings, Reading("the appenders' node", places.writer)):
        wait_until(
            partial(_equal, reading, committed), timeout=30, what=f"every deposit on {reading.name}"
        )
    bound = plan.overshoot_ms / 1000
    late = [x for x in tally.overshoots if max(x[:2]) > bound]
    assert not late, f"{len(late)} timeouts overshot {plan.overshoot_ms} ms: {late[:10]}\n{context}"


def _equal(reading: Reading, committed: dict[str, int]) -> bool:
    stored = reading.balances()
    assert set(stored) <= set(committed), f"accounts never deposited to: {stored}"
    assert all(stored[a] <= n for a, n in committed.items() if a in stored), (stored, committed)
    return stored == committed
