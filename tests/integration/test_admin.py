"""The admin server: JSON reports over HTTP and the HTML page, against a live instance."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_client import (
    TOKEN_CONFIG,
    admin_process,
    chromium,
    get,
    get_json,
    post,
    screenshot,
    serve,
)
from admin_schemas import CLUSTER, COMMAND, CONSUMERS, ERROR, INSTANCES, check
from clusters import lag, wait_until, write_config

from messaging import Database, Instance, MessageStore, collect_consumers, create_plugin_manager
from messaging._config import load_settings
from messaging._settings import Settings
from projections._admin import DATABASE_UNAVAILABLE, NO_EXPORTER, make_server
from projections._cluster import (
    NO_LIVE_MEMBER,
    NOT_A_MEMBER,
    SINGLE_OWNER_REASON,
    cluster_report,
    ranges,
)
from projections.examples import ledger

INSTANCE_NAME = "admin-test-instance"


# -- the pure cluster view ---------------------------------------------------------------


def test_ranges_group_contiguous_partitions() -> None:
    assert ranges([]) == []
    assert ranges([5, 0, 2, 1]) == [[0, 2], [5, 5]]
    assert ranges([7]) == [[7, 7]]
    assert ranges(range(8)) == [[0, 7]]


def _partition(no: int, owner: str | None, state: str) -> dict[str, Any]:
    return {"partition": no, "instance_id": owner, "instance": owner, "state": state}


def test_cluster_report_shares_partitions_among_live_members() -> None:
    instances = {
        "instances": [
            {"id": "b", "name": "beta", "host": "h", "pid": 2, "live": True},
            {"id": "a", "name": "alpha", "host": "h", "pid": 1, "live": True},
            {"id": "z", "name": "gone", "host": "h", "pid": 3, "live": False},
        ]
    }
    owners = ["a", "a", "a", "b", "b", "a", "z", None]
    consumers = {
        "consumers": [
            {
                "name": "balances",
                "kind": "projection",
                "distribution": "partitioned",
                "partitions": [
                    _partition(
                        i, o, "OWNED" if o in ("a", "b") else "ORPHANED" if o else "UNCLAIMED"
                    )
                    for i, o in enumerate(owners)
                ],
            },
            {
                "name": "ordered",
                "kind": "projection",
                "distribution": "single-owner",
                "partitions": [_partition(i, "b", "OWNED") for i in range(4)],
            },
        ]
    }
    report = cluster_report(consumers, instances, "me:1")
    assert report["answered_by"] == "me:1"
    assert [m["id"] for m in report["members"]] == ["a", "b"]
    balances, ordered = report["consumers"]
    assert balances["partitioned"] is True and "reason" not in balances
    assert balances["partitions"] == 8
    assert [(s["instance"], s["ranges"], s["share"]) for s in balances["shares"]] == [
        ("alpha", [[0, 2], [5, 5]], 0.5),
        ("beta", [[3, 4]], 0.25),
    ]
    assert balances["unowned"] == [[6, 7]]
    assert ordered["partitioned"] is False
    assert ordered["reason"] == SINGLE_OWNER_REASON
    assert [(s["instance"], s["ranges"], s["share"]) for s in ordered["shares"]] == [
        ("alpha", [], 0.0),
        ("beta", [[0, 3]], 1.0),
    ]


def test_cluster_report_of_an_empty_database() -> None:
    report = cluster_report({"consumers": []}, {"instances": []}, "me:1")
    assert report["members"] == report["consumers"] == []
    assert report["serving"] == {"member": False, "id": None, "name": None, "note": NOT_A_MEMBER}
    assert report["no_live_member"] == NO_LIVE_MEMBER


# -- a live instance and the server ------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Database, Settings]]:
    """(base URL, db, settings): a ledger instance that has applied some traffic, and an
    admin server on a free port in a thread."""
    tmp = tmp_path_factory.mktemp("admin")
    db = Database(f"sqlite:///{tmp}/admin.db", table_prefix="prj_")
    db.prepare()
    settings = load_settings(str(write_config(tmp / "config.yaml", db, extra=TOKEN_CONFIG)))
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name=INSTANCE_NAME)
    instance.start()
    server = None
    try:
        store = MessageStore(db)
        with db.transaction() as conn:
            for command in ledger.traffic(3, 60, accounts=20):
                for source, event in command:
                    store.append(conn, ledger.TOPIC, source, [event])

        def caught_up() -> bool:
            from projections._reports import consumers_report

            if lag(db) != 0:
                return False
            report = consumers_report(db, settings.messaging.consumer)
            balances = next(c for c in report["consumers"] if c["name"] == "ledger-balances")
            return all(p["state"] == "OWNED" for p in balances["partitions"])

        wait_until(caught_up, timeout=30, what="the instance to own and apply every partition")
        server = make_server(db, settings, "127.0.0.1", 0)
        base, thread = serve(server)
        yield base, db, settings
        server.shutdown()
        thread.join()
    finally:
        if server is not None:
            server.server_close()
        instance.stop()
        db.dispose()


def _copies(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["name"], i["instance_id"]) for c in report["in_memory"] for i in c["instances"]]


def test_consumers_route_is_the_consumers_report(live: tuple[str, Database, Settings]) -> None:
    from projections._reports import consumers_report

    base, db, settings = live
    status, body = get_json(base + "/admin/consumers")
    assert status == 200
    check(body, CONSUMERS)
    report = json.loads(json.dumps(consumers_report(db, settings.messaging.consumer)))
    assert body["consumers"] == report["consumers"]
    # In-memory copies move with every heartbeat: the same copies, not the same positions.
    assert _copies(body) == _copies(report)
    assert [name for name, _ in _copies(body)] == ["ledger-activity"]
    balances = next(c for c in body["consumers"] if c["name"] == "ledger-balances")
    assert {"name", "kind", "distribution", "state", "partitions"} <= balances.keys()
    assert [p["partition"] for p in balances["partitions"]] == list(range(8))
    for p in balances["partitions"]:
        assert p["instance"] == INSTANCE_NAME
        assert p["state"] == "OWNED"
        assert p["lag"] == 0
        assert {"status", "checkpoint"} <= p.keys()
    assert sum(p["checkpoint"] > 0 for p in balances["partitions"]) > 0


def test_instances_route_lists_the_live_instance(live: tuple[str, Database, Settings]) -> None:
    base, _, _ = live
    status, body = get_json(base + "/admin/instances")
    assert status == 200
    check(body, INSTANCES)
    [instance] = body["instances"]
    assert instance["name"] == INSTANCE_NAME
    assert instance["live"] is True
    assert instance["pid"] == os.getpid()


def test_cluster_route_shares_every_partition(live: tuple[str, Database, Settings]) -> None:
    base, _, _ = live
    status, body = get_json(base + "/admin/cluster")
    assert status == 200
    check(body, CLUSTER)
    assert body["answered_by"].endswith(f":{os.getpid()}")
    [member] = body["members"]
    assert member["name"] == INSTANCE_NAME
    balances = next(c for c in body["consumers"] if c["name"] == "ledger-balances")
    assert balances["partitioned"] is True
    assert balances["partitions"] == 8
    assert sum(s["share"] for s in balances["shares"]) == pytest.approx(1.0)
    covered = sorted(n for s in balances["shares"] for a, b in s["ranges"] for n in range(a, b + 1))
    assert covered == list(range(8))
    assert balances["unowned"] == []


def test_unknown_routes_answer_404_json(live: tuple[str, Database, Settings]) -> None:
    base, _, _ = live
    for path in ("/admin/nope", "/", "/admin/consumers/extra"):
        status, body = get_json(base + path)
        assert status == 404
        check(body, ERROR)


def test_the_page_is_self_contained_html(live: tuple[str, Database, Settings]) -> None:
    base, _, _ = live
    status, content_type, body = get(base + "/admin")
    assert status == 200
    assert content_type.startswith("text/html")
    page = body.decode()
    for route in ("/admin/consumers", "/admin/instances", "/admin/cluster"):
        assert route in page
    page = page.replace('"http://www.w3.org/2000/svg"', "")  # a name, never fetched
    assert "http://" not in page and "https://" not in page  # nothing fetched from elsewhere


def test_database_errors_answer_503_without_the_database_text(tmp_path: Path) -> None:
    """A database the server cannot use answers 503 with a fixed line; the database's own
    message (here "no such table") stays in the log."""
    db = Database(f"sqlite:///{tmp_path}/empty.db", table_prefix="prj_")  # never prepared
    server = make_server(db, Settings(), "127.0.0.1", 0)
    base, thread = serve(server)
    try:
        for path in ("/admin/consumers", "/admin/instances", "/admin/cluster"):
            status, body = get_json(base + path)
            assert status == 503
            assert check(body, ERROR)["error"] == DATABASE_UNAVAILABLE
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        db.dispose()


def test_metrics_without_the_exporter_name_the_missing_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin enabled without the Prometheus exporter installed (as if its import had
    failed): ``/metrics`` names the extra to install, not the plugin to enable."""
    import projections_otel.prometheus as prometheus

    monkeypatch.setattr(prometheus, "_installed", False)
    db = Database(f"sqlite:///{tmp_path}/metrics.db", table_prefix="prj_")
    hooks = create_plugin_manager(["projections_otel"], load_entrypoints=False).hook
    server = make_server(db, Settings(), "127.0.0.1", 0, hooks=hooks)
    base, thread = serve(server)
    try:
        assert get_json(base + "/metrics") == (404, {"error": NO_EXPORTER})
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        db.dispose()
    assert "pip install 'projections[otel]'" in NO_EXPORTER and "is enabled" in NO_EXPORTER


@pytest.mark.multiprocess
def test_chromium_renders_a_row_per_partition(
    live: tuple[str, Database, Settings], tmp_path: Path
) -> None:
    """The page, rendered by a real headless browser, shows each partition of the
    ledger projection owned by the instance, the instances table and the cluster shares."""
    base, _, _ = live
    dom = chromium(tmp_path / "profile-dom", "--dump-dom", url=base + "/admin")
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    assert html.count("<tr data-partition=") == 8
    assert html.count('data-consumer="ledger-balances"') == 8
    assert f"<td>{INSTANCE_NAME}</td>" in html
    assert "<tr data-instance=" in html
    assert "<tr data-member=" in html
    assert '<div id="status" class="">updated ' in html

    screenshot(tmp_path, base + "/admin")


@pytest.mark.multiprocess
def test_the_admin_command_serves_until_sigterm(tmp_path: Path) -> None:
    """``projections admin --port 0`` prints its URL, answers, and stops cleanly on SIGTERM."""
    url = f"sqlite:///{tmp_path}/cli.db"
    db = Database(url)
    db.prepare()
    db.dispose()
    with admin_process("admin", "--port", "0", "--database", url) as (process, base):
        assert base.startswith("http://127.0.0.1:")
        status, body = get_json(base + "/admin/cluster")
        assert status == 200
        assert body["answered_by"].endswith(f":{process.pid}")


def test_operator_commands_over_http_are_applied_and_audited(
    live: tuple[str, Database, Settings],
) -> None:
    """POST pause then resume: the consumer's state follows and both are in the audit log."""
    from projections._operations import audit_log

    base, db, _ = live
    route = f"{base}/admin/consumers/ledger-balances"
    assert post(f"{route}/pause", {"reason": "check"}) == (
        200,
        {"consumer": "ledger-balances", "command": "pause"},
    )
    status, data = get_json(f"{base}/admin/consumers")
    assert [c["state"] for c in data["consumers"] if c["name"] == "ledger-balances"] == ["paused"]
    status, error = post(f"{route}/pause", {})
    assert status == 409 and "already paused" in check(error, ERROR)["error"]
    status, resumed = post(f"{route}/resume", {})
    assert status == 200 and check(resumed, COMMAND)["halted"] == []
    assert post(f"{base}/admin/consumers/nope/rebuild", {})[0] == 409
    assert post(f"{base}/admin/consumers/ledger-balances/explode", {})[0] == 404
    log = [
        (e["command"], e["who"], e["detail"]["reason"]) for e in audit_log(db, "ledger-balances")
    ]
    who = "admin token@127.0.0.1"  # the server's view of who asked
    assert log[-2:] == [("pause", who, "check"), ("resume", who, "")]


@pytest.mark.multiprocess
def test_run_serves_the_admin_endpoints_alongside_the_instance(tmp_path: Path) -> None:
    """`run --admin-port 0` prints the page's address and answers for its own instance."""
    database = f"sqlite:///{tmp_path}/run-admin.db"
    with admin_process(
        "--log-level",
        "WARNING",
        "run",
        "projections.examples.ledger",
        "--database",
        database,
        "--admin-port",
        "0",
        "--instance-name",
        "with-admin",
    ) as (_, base):
        assert base.startswith("http://127.0.0.1:")

        def named() -> list[str]:
            try:  # the page is up before the instance has made its tables
                status, data = get_json(f"{base}/admin/instances")
            except OSError:
                return []
            return [i["name"] for i in data["instances"] if i["live"]] if status == 200 else []

        wait_until(lambda: named() == ["with-admin"], timeout=30, what="the instance to show up")
