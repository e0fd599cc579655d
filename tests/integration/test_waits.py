"""Feedback during waits, with the default rebalance-interval of 10 s: a joining instance
says what it waits for and gets it well before the next regular round; a rebuild is picked
up and replayed without waiting for rounds, its progress moving as messages are replayed."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tally_app
import yaml
from clusters import SUPPORT, stop_instance, wait_until
from sqlalchemy import MetaData
from tally_cluster import TallyCluster

from messaging import Database, Instance, Settings, collect_consumers, create_plugin_manager
from messaging._settings import ConsumerSettings
from messaging.distribution._membership import Membership
from messaging.distribution._ownership import Ownership
from projections._operations import pause
from projections._reports import consumers_report

pytestmark = pytest.mark.multiprocess

CLI = [sys.executable, "-m", "projections.cli"]
SLOW_ROUNDS = {
    "rebalance-interval": "10s",
    "heartbeat-interval": "1s",
    "idle-poll-interval": "50ms",
}
"""The default rebalance-interval: only the pulse can make things move sooner than it."""


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    """The tally's table, dropped around each MySQL test: the tests count its rows."""
    return [tally_app.metadata]


class Instances:
    """`projections run tally_app` processes logging at INFO, each to a file of its own."""

    def __init__(
        self,
        db: Database,
        folder: Path,
        consumer: dict[str, str] | None = None,
        projections: dict[str, Any] | None = None,
    ) -> None:
        """``consumer``: the consumer settings (default :data:`SLOW_ROUNDS`);
        ``projections``: the configuration's ``projections`` section, if any."""
        self.db, self.folder = db, folder
        self.config = folder / "slow.yaml"
        settings: dict[str, Any] = {
            "database": db.url,
            "table-prefix": db.schema.prefix,
            "messaging": {"consumer": SLOW_ROUNDS if consumer is None else consumer},
        }
        if projections is not None:
            settings["projections"] = projections
        self.config.write_text(yaml.safe_dump(settings), encoding="utf-8")
        self.processes: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []

    def start(self, name: str) -> None:
        self.names.append(name)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), env.get("PYTHONPATH")]))
        with (self.folder / f"{name}.log").open("wb") as log:
            self.processes.append(
                subprocess.Popen(
                    [
                        *CLI,
                        "run",
                        "tally_app",
                        "--config",
                        str(self.config),
                        "--instance-name",
                        name,
                    ],
                    stderr=log,
                    env=env,
                )
            )

    def stop(self, name: str) -> None:
        """SIGTERM the instance started as ``name`` (the n-th started) and wait for its exit."""
        assert stop_instance(self.processes[self.names.index(name)]) == 0

    def registered(self) -> set[str]:
        """The names of the instances registered now."""
        with self.db.read() as conn:
            return {i.name for i in Membership(self.db).instances(conn, 30.0)}

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(encoding="utf-8")

    def owned(self) -> dict[str, int]:
        """How many partitions of the tally each instance owns."""
        counts: dict[str, int] = {}
        for consumer in consumers_report(self.db, ConsumerSettings())["consumers"]:
            for p in consumer["partitions"]:
                if p["state"] == "OWNED":
                    counts[p["instance"]] = counts.get(p["instance"], 0) + 1
        return counts


@pytest.fixture
def instances(db: Database, tmp_path: Path) -> Iterator[Instances]:
    running = Instances(db, tmp_path)
    try:
        yield running
    finally:
        for process in running.processes:
            if process.poll() is None:
                assert stop_instance(process) == 0


def test_a_joiner_says_what_it_waits_for_and_gets_it_soon(instances: Instances) -> None:
    """The joiner's partitions arrive within about a second of its registration, not at
    the next 10 s round. If its first round found them still held (the holder's pulse
    had not seen it join yet), it logged what it waits for and the bound, then that it has
    its share."""
    instances.start("a")
    wait_until(lambda: instances.owned() == {"a": 4}, timeout=60, what="a owning the tally")
    instances.start("b")
    wait_until(lambda: "b" in instances.registered(), timeout=60, what="b registered")
    started = time.monotonic()
    wait_until(lambda: instances.owned() == {"a": 2, "b": 2}, timeout=30, what="the handover")
    assert time.monotonic() - started < 5.0
    wait_until(lambda: "started with" in instances.log("b"), timeout=30, what="b's start line")
    if "waiting for" in instances.log("b"):
        assert (
            "waiting for 2 partition(s) of tally held by live instances: they hand them over "
            "at their next rebalance round, usually within 1 s, at most 20 s"
        ) in instances.log("b")
        wait_until(
            lambda: "has its share of every consumer after" in instances.log("b"),
            timeout=30,
            what="b's line saying it has its share",
        )


def _tally_instance(db: Database, name: str) -> Instance:
    """An in-process instance of ``tally_app``, driven by hand (``start(loops=False)``)."""
    manager = create_plugin_manager(["tally_app"], load_entrypoints=False)
    return Instance(db, collect_consumers(manager), Settings(), manager.hook, name=name)


def test_a_joiner_whose_share_is_held_says_so_then_that_it_has_it(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Rounds driven by hand, so that the joiner's first round surely finds its share held:
    it logs what it waits for and the bound at start, and once the holder's round has
    handed the share over, that it has it and after how long."""
    a, b = _tally_instance(db, "a"), _tally_instance(db, "b")
    a.start(loops=False)  # the only instance: holds all 4 partitions
    try:
        with caplog.at_level(logging.INFO, logger="messaging"):
            b.start(loops=False)
            assert not b.workers[tally_app.CONSUMER].claims()
            assert (
                "instance b: waiting for 2 partition(s) of tally held by live instances: they "
                "hand them over at their next rebalance round, usually within 1 s, at most "
                "20 s (two rebalance-intervals) plus a batch in flight"
            ) in caplog.text
            assert "has its share" not in caplog.text
            a.rebalance()  # a sees b and hands over b's share
            b.rebalance()
            assert len(b.workers[tally_app.CONSUMER].claims()) == 2
            assert re.search(
                r"instance b: has its share of every consumer after \d+\.\d s", caplog.text
            )
    finally:
        b.stop()
        a.stop()


@pytest.mark.parametrize("held_back", ["halted", "paused"])
def test_a_share_that_waits_for_an_operator_is_not_awaited_from_live_instances(
    db: Database, caplog: pytest.LogCaptureFixture, held_back: str
) -> None:
    """A partition halted at a poison message (or a paused consumer) is claimed by nobody
    until an operator resumes it: an instance starting alone says so, naming the command,
    and never that live instances hold it and hand it over within a second."""
    a = _tally_instance(db, "a")
    a.start(loops=False)
    if held_back == "halted":
        claim = a.workers[tally_app.CONSUMER].claims()[0]
        with db.transaction() as conn:
            assert Ownership(db).halt(
                conn, tally_app.CONSUMER, claim, a.id, position=1, type_name="t", error="boom"
            )
    else:
        pause(db, tally_app.CONSUMER, who="test")
    a.stop()  # releases every partition, a halted one too
    expected = (
        "1 partition(s) of tally halted"
        if held_back == "halted"
        else "4 partition(s) of tally paused"
    )
    b = _tally_instance(db, "b")
    try:
        with caplog.at_level(logging.INFO, logger="messaging"):
            b.start(loops=False)
        assert len(b.workers[tally_app.CONSUMER].claims()) == (3 if held_back == "halted" else 0)
        assert (
            f"instance b: {expected} (`projections resume tally`): they wait for an operator, "
            "not for another instance"
        ) in caplog.text
        assert "held by live instances" not in caplog.text
    finally:
        b.stop()


def test_rebuild_progress_moves_as_messages_are_replayed(
    db: Database, instances: Instances, tmp_path: Path
) -> None:
    """With two instances and 10 s rounds, a requested rebuild's version is started, handed
    out, built and cut over within a few seconds; the progress seen meanwhile only grows."""
    instances.start("a")
    instances.start("b")
    wait_until(lambda: instances.owned() == {"a": 2, "b": 2}, timeout=60, what="the tally shared")
    tally = TallyCluster(db, tmp_path)
    tally.append(400)
    tally.wait_applied_by(1, "the tally applied")
    subprocess.run(
        [*CLI, "rebuild", tally_app.CONSUMER, "--config", str(instances.config)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    started = time.monotonic()
    seen: list[int] = []

    def rebuilt() -> bool:
        consumers = {c["name"]: c for c in consumers_report(db, ConsumerSettings())["consumers"]}
        building = consumers.get(f"{tally_app.CONSUMER}@2", {})
        if "build" in building:
            seen.append(building["build"]["applied"])
        live = consumers[tally_app.CONSUMER]
        return bool(live["version"] == 2 and sum(p["lag"] for p in live["partitions"]) == 0)

    wait_until(rebuilt, timeout=60, what="the rebuild done")
    assert time.monotonic() - started < 5.0
    assert seen == sorted(seen)
    tally.wait_applied_by(1, "the tally replayed")


def test_at_the_default_settings_a_join_and_a_clean_stop_take_about_a_second(
    db: Database, tmp_path: Path
) -> None:
    """Every setting at its default (rebalance 10 s, heartbeat 5 s, idle-poll 200 ms): the
    joiner owns its share within about a second (+ a batch, here milliseconds) of its
    registration, and a clean stop's partitions are owned again within about a second of
    their release (the leaver's row goes in the same transaction)."""
    instances = Instances(db, tmp_path, consumer={})
    try:
        instances.start("a")
        wait_until(lambda: instances.owned() == {"a": 4}, timeout=60, what="a owning the tally")
        instances.start("b")
        wait_until(lambda: "b" in instances.registered(), timeout=60, what="b registered")
        registered = time.monotonic()
        wait_until(lambda: instances.owned() == {"a": 2, "b": 2}, timeout=30, what="the join")
        joined = time.monotonic() - registered
        process = instances.processes[1]
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: "b" not in instances.registered(), timeout=30, what="b's release")
        released = time.monotonic()
        wait_until(lambda: instances.owned() == {"a": 4}, timeout=30, what="the takeover")
        taken = time.monotonic() - released
        assert process.wait(timeout=30) == 0
        assert joined < 1.5, f"the join took {joined:.2f} s after the registration"
        assert taken < 1.5, f"the takeover took {taken:.2f} s after the release"
    finally:
        for process in instances.processes:
            if process.poll() is None:
                assert stop_instance(process) == 0


def test_at_the_default_settings_a_single_owner_standby_takes_over_within_a_second(
    db: Database, tmp_path: Path
) -> None:
    """Every setting at its default, the tally single-owner on two instances: when the
    elected owner stops cleanly, the standby owns every partition and applies what was
    appended at the release within about a second of it (the reference: 10 s)."""
    single_owner = {"consumers": {tally_app.CONSUMER: {"distribution": "single-owner"}}}
    instances = Instances(db, tmp_path, consumer={}, projections=single_owner)
    tally = TallyCluster(db, tmp_path)
    try:
        instances.start("a")
        wait_until(lambda: instances.owned() == {"a": 4}, timeout=60, what="a owning the tally")
        instances.start("b")
        wait_until(lambda: "b" in instances.registered(), timeout=60, what="b registered")
        instances.processes[0].send_signal(signal.SIGTERM)
        wait_until(lambda: "a" not in instances.registered(), timeout=30, what="a's release")
        released = time.monotonic()
        tally.append(10)
        tally.wait_applied_by(1, "the standby applying the tally")
        taken = time.monotonic() - released
        assert instances.owned() == {"b": 4}
        assert instances.processes[0].wait(timeout=30) == 0
        assert taken < 1.5, f"the standby applied {taken:.2f} s after the release"
    finally:
        for process in instances.processes:
            if process.poll() is None:
                assert stop_instance(process) == 0
