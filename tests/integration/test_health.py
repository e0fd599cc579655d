"""Health verdicts of real ``projections run`` processes, from the database: a frozen owner
is ``stalled``, then ``unowned``, then ``caught-up`` once another instance took over; a
pause, a rebuild and clean handovers raise no alarm; a halted partition is ``halted``; and
``projections health`` exits 0, 1, 2 (3 on an error) accordingly; the probes of an
instance's admin port answer 503 for ``ready`` while it stops and for ``live`` once a
loop of it died."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import health_app
import pytest
from clusters import live_version, owned_by, start_instance, stop_instance, wait_until, write_config
from forked import Process
from freezing import freeze
from sqlalchemy import MetaData

from messaging import Database
from messaging._config import load_settings
from messaging._settings import Settings
from messaging._states import Severity, Verdict
from projections import _operations as operations
from projections._health import health_report
from projections._reports import instances_report

pytestmark = pytest.mark.multiprocess

CONSUMER = health_app.CONSUMER
HEARTBEAT = 0.2
STALL = 1.0
SLACK = 1.5
"""Seconds a verdict may come later than its bound: the health reads of a loaded machine."""


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [health_app.metadata]


def _config(tmp_path: Path, db: Database, *, stale: float, stall: float = STALL) -> Path:
    timings = {
        "stale-instance-timeout": f"{stale}s",
        "heartbeat-interval": f"{HEARTBEAT}s",
        "graceful-shutdown-timeout": "6s",
        "conflict-retry": {"max-retries": 3, "max-delay": "100ms"},
    }
    extra = f"health:\n  stall-timeout: {stall}s\n"
    return write_config(tmp_path / "config.yaml", db, consumer=timings, extra=extra)


def _start(
    config: Path, name: str, tmp_path: Path, admin_port: int | None = None, version: int = 1
) -> Process:
    return start_instance(
        config,
        name,
        "health_app",
        env={"HEALTH_DIR": str(tmp_path), "HEALTH_VERSION": str(version)},
        log=tmp_path / f"{name}.log",
        options=() if admin_port is None else ("--admin-port", str(admin_port)),
    )


def _consumer(db: Database, settings: Settings) -> dict[str, Any] | None:
    """The health of the test's consumer (None until an instance declared it)."""
    consumers = health_report(db, settings)["consumers"]
    return next((c for c in consumers if c["name"] == CONSUMER), None)


def _verdict(db: Database, settings: Settings) -> str | None:
    entry = _consumer(db, settings)
    return None if entry is None else str(entry["verdict"])


def _caught_up(db: Database, settings: Settings, count: int) -> bool:
    return health_app.applied(db) == count and _verdict(db, settings) == Verdict.CAUGHT_UP


def test_a_frozen_owner_is_stalled_then_unowned_then_caught_up_after_a_takeover(
    db: Database, tmp_path: Path
) -> None:
    """SIGSTOP the only instance with messages to apply: ``lagging`` at once, ``stalled``
    after the stall timeout, ``unowned`` at stale-instance-timeout + 1 s after its last
    heartbeat (each within one heartbeat and some slack); a new instance takes over and
    the consumer is ``caught-up`` again."""
    stale = 3.0
    config = _config(tmp_path, db, stale=stale)
    settings = load_settings(config, environ={})
    first = _start(config, "p1", tmp_path)
    health_app.append(db, 0, 20)
    wait_until(lambda: _caught_up(db, settings, 20), timeout=60, what="p1 to apply 20")

    freeze(first, db)
    frozen = time.monotonic()
    health_app.append(db, 20, 20)
    appended = time.monotonic()
    verdict = _verdict(db, settings)
    if time.monotonic() - appended < STALL:  # (a machine this slow could not tell)
        assert verdict == Verdict.LAGGING

    wait_until(
        lambda: _verdict(db, settings) == Verdict.STALLED, timeout=30, what="a stalled verdict"
    )
    stalled = time.monotonic()
    assert STALL - 0.1 <= stalled - frozen <= STALL + HEARTBEAT + SLACK
    entry = _consumer(db, settings)
    assert entry is not None and entry["severity"] == Severity.DEGRADED
    reasons = [p["reason"] for p in entry["partitions"] if p["verdict"] == Verdict.STALLED]
    assert reasons and all("past health.stall-timeout 1s" in r for r in reasons)

    wait_until(
        lambda: _verdict(db, settings) == Verdict.UNOWNED, timeout=30, what="an unowned verdict"
    )
    assert time.monotonic() - frozen <= stale + 1 + HEARTBEAT + SLACK
    report = health_report(db, settings)
    (partition, *_) = report["consumers"][0]["partitions"]
    heard = float(partition["reason"].split(" was last heard ")[1].split(" s ago")[0])
    assert heard >= stale + 1  # by the database's clock (to 0.1 s): not a heartbeat early
    assert report["status"] == Severity.CRITICAL
    assert report["thresholds"] == {"stall_timeout": STALL, "unowned_after": stale + 1}

    second = _start(config, "p2", tmp_path)
    wait_until(lambda: _caught_up(db, settings, 40), timeout=60, what="p2 to take over")
    assert health_report(db, settings)["status"] == Severity.HEALTHY
    first.kill()
    first.wait(timeout=10)
    assert stop_instance(second) == 0


class _Sampler:
    """Appends a message every 20 ms and reads the health every 50 ms meanwhile, keeping
    every (moment, status, consumer verdict) read, and each report that is not healthy
    (or the error of a read that failed) whole."""

    def __init__(self, db: Database, settings: Settings, first: int) -> None:
        self.db, self.settings = db, settings
        self.appended = first
        self.samples: list[tuple[float, str, str | None]] = []
        self.alarms: list[Any] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._append, daemon=True),
            threading.Thread(target=self._sample, daemon=True),
        ]

    def _append(self) -> None:
        while not self._stop.wait(0.02):
            health_app.append(self.db, self.appended, 1)
            self.appended += 1

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            try:
                report = health_report(self.db, self.settings)
            except Exception as exc:
                self.samples.append((time.monotonic(), repr(exc), None))
                self.alarms.append(repr(exc))
                raise
            consumer = next((c for c in report["consumers"] if c["name"] == CONSUMER), None)
            verdict = None if consumer is None else str(consumer["verdict"])
            building = [c for c in report["consumers"] if c["name"].startswith(f"{CONSUMER}@")]
            if any(c["verdict"] == Verdict.REBUILDING for c in building):
                verdict = Verdict.REBUILDING  # a new version built beside the live one
            self.samples.append((time.monotonic(), str(report["status"]), verdict))
            if report["status"] != Severity.HEALTHY:
                self.alarms.append(report)

    def wait_settled(self, what: str) -> None:
        """Until every message appended so far is applied and no rebuild is going on."""
        behind = self.appended
        wait_until(
            lambda: (
                health_app.applied(self.db) >= behind and self.samples[-1][2] != Verdict.REBUILDING
            ),
            timeout=60,
            what=what,
        )

    def seen_for(self, verdict: str) -> float:
        """Seconds between the first and the last sample with ``verdict``."""
        times = [t for t, _, v in self.samples if v == verdict]
        return times[-1] - times[0] if times else 0.0

    @contextmanager
    def running(self) -> Iterator[_Sampler]:
        for thread in self._threads:
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join(timeout=30)


@pytest.mark.alone  # a 2 s stall bound on SQLite: met under load by a test beside it
def test_a_pause_a_rebuild_and_clean_handovers_raise_no_alarm(db: Database, tmp_path: Path) -> None:
    """Under steady traffic, with the health read every 50 ms: a pause held for twice the
    stall timeout, a resume, a rebuild, a clean stop handing partitions over, a join
    taking some back, and a rolling deploy of a new declaration (its first instance
    builds a new version, the old ones stop once it took over); every reading is healthy
    (``paused`` and ``rebuilding`` seen)."""
    stall = 2.0
    config = _config(tmp_path, db, stale=3.0, stall=stall)
    settings = load_settings(config, environ={})
    processes = {name: _start(config, name, tmp_path) for name in ("p1", "p2")}
    health_app.append(db, 0, 3000)  # a rebuild long enough for the readings to see it
    wait_until(
        lambda: health_app.applied(db) == 3000, timeout=60, what="the first messages applied"
    )
    wait_until(
        lambda: set((owned_by(db, {"p1", "p2"}, CONSUMER) or {}).values()) == {"p1", "p2"},
        timeout=60,
        what="p1 and p2 to share the partitions",
    )
    sampler = _Sampler(db, settings, 3000)
    with sampler.running():
        operations.pause(db, CONSUMER, who="test", reason="health")
        wait_until(lambda: sampler.seen_for(Verdict.PAUSED) > 2 * stall, timeout=60, what="pause")
        operations.resume(db, CONSUMER, who="test")
        sampler.wait_settled("the backlog applied")

        operations.rebuild(db, CONSUMER, who="test", reason="health")
        wait_until(lambda: sampler.seen_for(Verdict.REBUILDING) > 0, timeout=60, what="rebuild")
        sampler.wait_settled("the rebuild to finish")

        assert stop_instance(processes.pop("p2")) == 0
        wait_until(lambda: owned_by(db, {"p1"}, CONSUMER), timeout=60, what="p1 to take p2's share")
        processes["p2"] = _start(config, "p2", tmp_path)
        wait_until(
            lambda: set((owned_by(db, {"p1", "p2"}, CONSUMER) or {}).values()) == {"p1", "p2"},
            timeout=60,
            what="p2 to take its share back",
        )
        sampler.wait_settled("the handovers to settle")

        rebuilds = sampler.seen_for(Verdict.REBUILDING)
        processes["p3"] = _start(config, "p3", tmp_path, version=2)
        wait_until(
            lambda: sampler.seen_for(Verdict.REBUILDING) > rebuilds,
            timeout=60,
            what="the new declaration's rebuild",
        )
        # The old instances keep the live version current until the new one takes over.
        wait_until(lambda: live_version(db, CONSUMER) == 3, timeout=60, what="the cutover")
        for name in ("p1", "p2"):
            assert stop_instance(processes.pop(name)) == 0
        sampler.wait_settled("the new declaration to catch up")
    assert not sampler.alarms, sampler.alarms[:3]
    assert len(sampler.samples) > 50
    for name, process in processes.items():
        assert stop_instance(process) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]


def test_halted_partitions_and_the_exit_codes_of_projections_health(
    db: Database, tmp_path: Path
) -> None:
    """``projections health`` exits 0 while caught up, 1 while the frozen owner's partitions
    are stalled, 2 once a poison message halted a partition (``halted`` with its message),
    and 3 for a consumer it does not know, naming it."""
    config = _config(tmp_path, db, stale=20.0)
    settings = load_settings(config, environ={})
    process = _start(config, "p1", tmp_path)
    health_app.append(db, 0, 8)
    wait_until(lambda: _caught_up(db, settings, 8), timeout=60, what="p1 to apply 8")
    healthy = health_app.health_cli(config)
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.startswith("healthy")
    assert f"{CONSUMER}  caught-up  (healthy; version 1)" in healthy.stdout

    freeze(process, db)
    health_app.append(db, 8, 8)
    wait_until(lambda: _verdict(db, settings) == Verdict.STALLED, timeout=30, what="stalled")
    degraded = health_app.health_cli(config, "--json")
    assert degraded.returncode == 1, degraded.stderr
    report = json.loads(degraded.stdout)
    assert report["status"] == "degraded"
    assert report["consumers"][0]["verdict"] == "stalled"
    process.send_signal(signal.SIGCONT)
    wait_until(lambda: _caught_up(db, settings, 16), timeout=60, what="p1 to go on")

    health_app.append(db, 16, 1, fate="poison")
    wait_until(lambda: _verdict(db, settings) == Verdict.HALTED, timeout=60, what="a halt")
    critical = health_app.health_cli(config, CONSUMER)
    assert critical.returncode == 2, critical.stderr
    assert critical.stdout.startswith("critical")
    assert "halted      halted at position 17 (test.health.counted): ValueError" in critical.stdout
    entry = _consumer(db, settings)
    assert entry is not None
    assert sorted(p["verdict"] for p in entry["partitions"]) == ["caught-up"] * 3 + ["halted"]

    unknown = health_app.health_cli(config, "no-such-consumer")
    assert unknown.returncode == 3
    assert f"unknown consumer 'no-such-consumer'; known consumers: {CONSUMER}" in unknown.stderr
    assert stop_instance(process) == 0


def test_the_probes_while_an_instance_stops_and_once_its_apply_loop_died(
    db: Database, tmp_path: Path
) -> None:
    """``ready`` and ``live`` answer 200 while an instance runs; ``ready`` 503 (``live``
    200) while it stops behind a slow batch; on another instance whose apply loop ended
    (its handler raised ``SystemExit``), ``live`` 503 naming the loop and ``ready`` 200.
    The health routes answer beside: 404 naming an unknown consumer."""
    config = _config(tmp_path, db, stale=5.0)
    port = health_app.free_port()
    first = _start(config, "p1", tmp_path, admin_port=port)
    wait_until(lambda: _consumer(db, load_settings(config, environ={})), timeout=60, what="p1")
    wait_until(lambda: health_app.probe(port, "health/ready")[0] == 200, timeout=60, what="ready")
    assert health_app.probe(port, "health/live") == (
        200,
        {"status": "ok", "reasons": [], "by": ANY},
    )
    status, report = health_app.probe(port, "health")
    assert status == 200 and report["thresholds"]["stall_timeout"] == STALL
    status, one = health_app.probe(port, f"consumers/{CONSUMER}/health")
    assert status == 200 and [c["name"] for c in one["consumers"]] == [CONSUMER]
    assert health_app.probe(port, "consumers/nope/health") == (
        404,
        {"error": f"unknown consumer 'nope'; known consumers: {CONSUMER}"},
    )

    health_app.append(db, 0, 1, fate="slow")
    wait_until(lambda: (tmp_path / f"slow-{first.pid}").exists(), timeout=60, what="slow batch")
    first.send_signal(signal.SIGTERM)
    status, ready = wait_until(
        lambda: (answer := health_app.probe(port, "health/ready"))[0] == 503 and answer,
        timeout=30,
        what="ready to answer 503",
    )
    assert ready["reasons"] == ["stopping"]
    assert health_app.probe(port, "health/live")[0] == 200
    assert first.wait(timeout=30) == 0

    port = health_app.free_port()
    second = _start(config, "p2", tmp_path, admin_port=port)
    wait_until(lambda: health_app.probe(port, "health/ready")[0] == 200, timeout=60, what="p2")
    health_app.append(db, 1, 1, fate="fatal")
    status, live = wait_until(
        lambda: (answer := health_app.probe(port, "health/live"))[0] == 503 and answer,
        timeout=30,
        what="live to answer 503",
    )
    assert live["reasons"] == [f"its apply:{CONSUMER} loop has ended"]
    assert health_app.probe(port, "health/ready")[0] == 200
    second.kill()
    second.wait(timeout=10)


def test_an_instance_left_on_a_replaced_declaration_is_named_once_past_the_stall_timeout(
    db: Database, tmp_path: Path
) -> None:
    """p1 runs version 1; p2 deploys version 2, which is built and takes over: p1 then
    applies nothing of the consumer. Within the stall timeout that is a rolling deploy
    (healthy); past it the consumer is ``outdated`` (degraded), naming p1, and p1's
    readiness says why it is not ready, until p1 stops."""
    config = _config(tmp_path, db, stale=3.0)
    settings = load_settings(config, environ={})
    port = health_app.free_port()
    old = _start(config, "p1", tmp_path, admin_port=port)
    health_app.append(db, 0, 200)
    wait_until(lambda: health_app.applied(db) == 200, timeout=60, what="p1 to apply")
    wait_until(lambda: health_app.probe(port, "health/ready")[0] == 200, timeout=60, what="ready")
    new = _start(config, "p2", tmp_path, version=2)
    wait_until(lambda: live_version(db, CONSUMER) == 2, timeout=60, what="the cutover")
    entry = wait_until(
        lambda: (c := _consumer(db, settings)) and c["verdict"] == Verdict.OUTDATED and c,
        timeout=STALL + 30,
        what="p1 to be named outdated",
    )
    assert [o["instance"] for o in entry["outdated"]] == ["p1"]
    assert entry["outdated"][0]["for"] > STALL
    assert health_report(db, settings)["status"] == Severity.DEGRADED
    listed = instances_report(db, settings.messaging.consumer)["instances"]
    assert {i["name"]: i["applies_nothing_of"] for i in listed} == {"p1": [CONSUMER], "p2": []}
    _, ready = wait_until(  # p1's own readiness says so too, past the stall timeout
        lambda: (answer := health_app.probe(port, "health/ready"))[0] == 503 and answer,
        timeout=30,
        what="p1 not ready",
    )
    assert [r.split(" for ")[0] for r in ready["reasons"]] == [f"applies nothing of {CONSUMER}"]
    assert stop_instance(old) == 0
    wait_until(
        lambda: (c := _consumer(db, settings)) and c["verdict"] == Verdict.CAUGHT_UP,
        timeout=30,
        what="healthy once p1 stopped",
    )
    assert stop_instance(new) == 0
