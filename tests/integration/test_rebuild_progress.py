"""A rebuild's new version reports its progress (messages applied of those there are)
until it takes over: in the report, ``status``, ``status --json``, ``/admin/consumers``
and the admin page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from admin_client import TOKEN, chromium, get_json, post, serve
from admin_schemas import CONSUMERS, check
from clusters import cli, seed_ledger, write_config

from messaging import Instance, collect_consumers, create_plugin_manager
from messaging._config import load_settings
from messaging._settings import AdminSettings
from messaging.store._database import Database
from projections import _operations as operations
from projections._admin import make_server
from projections._reports import consumers_report
from projections._version_commands import format_versions, versions_report

CONSUMER = "ledger-balances"
BUILDING = f"{CONSUMER}@2"


def _entry(db: Database, name: str = CONSUMER) -> dict[str, Any]:
    report = consumers_report(db, load_settings(None).messaging.consumer)
    return next(c for c in report["consumers"] if c["name"] == name)


@pytest.fixture
def rebuilder(db: Database, tmp_path: Path) -> Iterator[tuple[Path, Instance]]:
    """(config, instance): an instance driven by hand (no loops), batches of 20 messages
    (one lane, also on MySQL)."""
    config = write_config(
        tmp_path / "config.yaml",
        db,
        batch_size=20,
        extra=f"projections:\n  consumers:\n    {CONSUMER}: {{concurrency-limit: 1}}\n",
    )
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    settings = load_settings(str(config))
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="rebuilder")
    instance.start(loops=False)
    try:
        yield config, instance
    finally:
        instance.stop()


def test_a_rebuild_reports_the_new_versions_progress_until_it_takes_over(
    db: Database, rebuilder: tuple[Path, Instance], tmp_path: Path
) -> None:
    """The version being built is reported as ``ledger-balances@2`` with its progress
    (messages applied of those there are), which each batch moves on, beside the live
    version; after the cutover the live version is 2 and version 1 is retired."""
    config, instance = rebuilder
    live = instance.workers[CONSUMER]
    replayed = seed_ledger(db, 150)
    while live.poll():
        pass
    assert _entry(db)["version"] == 1 and "build" not in _entry(db)

    operations.rebuild(db, CONSUMER, who="test")
    instance.rebalance()  # starts version 2
    instance.rebalance()  # its worker claims every partition
    total = replayed + seed_ledger(db, 40, seed=2, prefix="later")
    building = instance.workers[BUILDING]

    entry = _entry(db, BUILDING)
    assert (entry["state"], entry["version"], entry["version_of"]) == ("running", 2, CONSUMER)
    assert (entry["build"]["applied"], entry["build"]["total"]) == (0, total)
    assert entry["build"]["rate"] == 0 and entry["build"]["eta_seconds"] is None
    assert building.poll() == 20
    entry = _entry(db, BUILDING)
    assert entry["build"]["applied"] == 20

    text = cli(config, "status")
    assert f"{BUILDING}  (projection, partitioned, version 2 of {CONSUMER}, building: " in text
    assert f"building: 20/{total} applied, " in text and " s left" in text
    as_json = check(json.loads(cli(config, "status", "--json")), CONSUMERS)
    (listed,) = [c for c in as_json["consumers"] if c["name"] == BUILDING]
    assert listed["build"]["applied"] == entry["build"]["applied"]
    assert listed["build"]["rate"] > 0 and listed["build"]["eta_seconds"] > 0
    _check_admin(db, config, tmp_path, entry)

    seen = [entry["build"]["applied"]]
    for _ in range(100):
        live.poll()
        building.poll()
        instance.rebalance()  # the cutover's steps, once the new version is close
        if _entry(db)["version"] == 2:
            break
        seen.append(_entry(db, BUILDING)["build"]["applied"])
    assert seen == sorted(seen) and seen[-1] <= total
    assert "build" not in _entry(db)
    assert _entry(db, f"{CONSUMER}@1")["state"] == "retired"
    instance.rebalance()  # the next round stops the version's own worker
    assert BUILDING not in instance.workers
    while instance.workers[CONSUMER].poll():
        pass
    assert sum(p["lag"] for p in _entry(db)["partitions"]) == 0


def _check_admin(db: Database, config: Path, tmp_path: Path, entry: dict[str, Any]) -> None:
    """``/admin/consumers`` carries the progress, and the page shows it."""
    settings = attrs.evolve(load_settings(str(config)), admin=AdminSettings(token=TOKEN))
    server = make_server(db, settings, "127.0.0.1", 0)
    base, thread = serve(server)
    try:
        status, versions = get_json(base + f"/admin/consumers/{CONSUMER}/versions")
        assert status == 200
        assert [(v["version"], v["role"]) for v in versions["versions"]] == [
            (1, "live"),
            (2, "building"),
        ]
        build = versions["versions"][1]["build"]
        assert build["applied"] == entry["build"]["applied"] and build["rate"] > 0
        assert build["eta_seconds"] is not None and build["eta_seconds"] >= 0
        status, answer = post(base + f"/admin/consumers/{CONSUMER}/rollback", {"reason": "x"})
        assert status == 409 and f"being built: {BUILDING}" in answer["error"], answer
        status, answer = get_json(base + "/admin/consumers/nope/versions")
        assert (status, answer) == (409, {"error": "unknown projection 'nope'"})
        status, body = get_json(base + "/admin/consumers")
        assert status == 200
        check(body, CONSUMERS)
        (listed,) = [c for c in body["consumers"] if c["name"] == BUILDING]
        assert listed["build"]["applied"] == entry["build"]["applied"]
        dom = chromium(tmp_path / "profile", "--dump-dom", url=base + "/admin")
        assert dom.returncode == 0, dom.stderr
        total = entry["build"]["total"]
        percent = f"{100 * 20 / total:.1f}"
        assert (
            f'<li data-consumer-state="{BUILDING}" class="building">{BUILDING}: version 2 of '
            f"{CONSUMER}, building 20/{total} ({percent}%), "
        ) in dom.stdout
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_build_no_live_instance_runs_says_so_instead_of_a_time_left(
    db: Database, tmp_path: Path
) -> None:
    """``projections versions`` names the live instances building a version; once none
    runs its declaration, it says so instead of a rate and a time left."""
    config = write_config(tmp_path / "config.yaml", db, consumer={"stale-instance-timeout": "60s"})
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    settings = load_settings(str(config))
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="builder")
    instance.start(loops=False)
    try:
        seed_ledger(db, 50)
        operations.rebuild(db, CONSUMER, who="test")
        instance.rebalance()  # starts version 2
        instance.rebalance()  # its worker runs: published as what the instance runs
        report = versions_report(db, settings.messaging.consumer, CONSUMER)
        [build] = [v["build"] for v in report["versions"] if "build" in v]
        assert build["builders"] == ["builder"]
    finally:
        instance.stop()
    report = versions_report(db, settings.messaging.consumer, CONSUMER)
    [build] = [v["build"] for v in report["versions"] if "build" in v]
    assert build["builders"] == []
    [line] = [line for line in format_versions(report).splitlines() if " building " in line]
    assert line.endswith(
        f"0/{build['total']} applied; no live instance runs this declaration: "
        "start one with it (or roll back)"
    ), line
