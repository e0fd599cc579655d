"""The ``projections`` command line: append, status, config errors and ``db migrate``."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clusters import wait_until
from sqlalchemy import inspect, text

from messaging import Database, Instance, MessageStore, collect_consumers, create_plugin_manager
from messaging._config import settings_from_mapping
from messaging.store._rows import partition_of
from projections._reports import instances_report
from projections.cli import main

MYSQL_URL_ENV = "PROJECTIONS_TEST_MYSQL_URL"

FAST = {
    "rebalance-interval": "200ms",
    "stale-instance-timeout": "2s",
    "heartbeat-interval": "100ms",
    "graceful-shutdown-timeout": "5s",
    "idle-poll-interval": "20ms",
    "conflict-retry": {"max-retries": 3, "max-delay": "100ms"},
}


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A fresh SQLite database file for this test."""
    return f"sqlite:///{tmp_path}/cli.db"


def _declare_ledger(url: str) -> None:
    """Declare the ledger consumers by starting and stopping an instance in-process."""
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    settings = settings_from_mapping({"database": url, "messaging": {"consumer": FAST}})
    db = Database(url)
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="declarer")
    try:
        instance.start()
    finally:
        instance.stop()
        db.dispose()


def _line(topic: str, source: str, type_: str, payload: dict[str, Any]) -> str:
    return json.dumps({"topic": topic, "source": source, "type": type_, "payload": payload})


def _ledger_lines(accounts: int) -> list[str]:
    lines = []
    for i in range(accounts):
        account = f"acct-{i}"
        lines.append(
            _line("ledger", account, "ledger.account-opened", {"account_id": account, "owner": "o"})
        )
        for amount in range(i % 3):
            lines.append(
                _line(
                    "ledger",
                    account,
                    "ledger.deposited",
                    {"account_id": account, "amount": amount + 1},
                )
            )
    return lines


def _write_lines(tmp_path: Path, lines: list[str], name: str = "input.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _stored(url: str) -> list[Any]:
    db = Database(url)
    try:
        db.prepare()
        with db.read() as conn:
            return list(MessageStore(db).read(conn, ["ledger", "other"], limit=100_000))
    finally:
        db.dispose()


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("projections: error: ")
    return lines[0]


# -- append and status ---------------------------------------------------------------------------


def test_append_then_status_reports_lag_per_partition(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After appending, each declared partition's lag is the number of its handled messages."""
    _declare_ledger(url)
    lines = _ledger_lines(30)
    lines.append(_line("other", "acct-1", "ledger.deposited", {"account_id": "x", "amount": 1}))
    lines.append(_line("ledger", "acct-2", "unhandled.type", {"anything": True}))
    path = _write_lines(tmp_path, lines)
    capsys.readouterr()

    unhandled_too = ["--allow-unknown-type"]  # a type the ledger does not handle, on purpose
    assert main(["append", str(path), "--database", url, "--batch-size", "7", *unhandled_too]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"appended {len(lines)} messages"

    assert main(["status", "--json", "--database", url]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"consumers", "in_memory"}
    (consumer,) = report["consumers"]
    assert {"name", "kind", "distribution", "partitions"} <= set(consumer)
    assert (consumer["name"], consumer["kind"], consumer["distribution"]) == (
        "ledger-balances",
        "projection",
        "partitioned",
    )
    handled = [json.loads(line) for line in lines]
    handled = [m for m in handled if m["topic"] == "ledger" and m["type"].startswith("ledger.")]
    expected_lag = Counter(partition_of(m["source"], 8) for m in handled)
    assert [p["partition"] for p in consumer["partitions"]] == list(range(8))
    for entry in consumer["partitions"]:
        assert {"partition", "instance", "state", "checkpoint", "lag"} <= set(entry)
        assert entry["state"] == "UNCLAIMED"
        assert entry["instance"] is None
        assert entry["checkpoint"] == 0
        assert entry["lag"] == expected_lag[entry["partition"]]
    assert sum(p["lag"] for p in consumer["partitions"]) == len(handled)


def test_status_as_text_and_before_any_declaration(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Status works on an empty database and lists a declared consumer's partitions as text."""
    empty = Database(url)
    empty.prepare()
    empty.dispose()
    assert main(["status", "--json", "--database", url]) == 0
    assert json.loads(capsys.readouterr().out) == {"consumers": [], "in_memory": []}
    _declare_ledger(url)
    capsys.readouterr()
    assert main(["status", "--database", url]) == 0
    out = capsys.readouterr().out
    assert "ledger-balances" in out
    assert out.count("UNCLAIMED") == 8
    assert main(["instances", "--json", "--database", url]) == 0
    assert json.loads(capsys.readouterr().out) == {"instances": []}


BAD_LINES = {
    "invalid-json": '{"topic": "ledger", "source": ',
    "missing-key": json.dumps({"topic": "ledger", "source": "s", "type": "t"}),
    "wrong-type": json.dumps({"topic": "ledger", "source": 5, "type": "t", "payload": {}}),
    "payload-not-object": json.dumps(
        {"topic": "ledger", "source": "s", "type": "t", "payload": [1]}
    ),
    "not-an-object": "[1, 2, 3]",
}


@pytest.mark.parametrize("bad", sorted(BAD_LINES))
def test_bad_line_in_second_batch_keeps_first_batch_only(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    """A bad line fails with its line number on one stderr line; only earlier batches are kept."""
    good = _ledger_lines(4)[:3]
    path = _write_lines(tmp_path, [*good[:2], good[2], BAD_LINES[bad]])
    assert main(["append", str(path), "--database", url, "--batch-size", "2"]) == 1
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert "line 4" in line
    assert "2 earlier lines" in line
    assert "appended" not in captured.out
    assert [(r[2], r[3]) for r in _stored(url)] == [("acct-0", 1), ("acct-1", 1)]


def test_bad_line_exit_code_and_stderr_of_the_process(url: str, tmp_path: Path) -> None:
    """Run as a process, a bad line exits 1 with one stderr line and no traceback."""
    lines = [*_ledger_lines(3)[:2], '{"oops"']
    path = _write_lines(tmp_path, lines)
    result = subprocess.run(
        [sys.executable, "-m", "projections.cli", "append", str(path), "--database", url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PROJECTIONS_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert result.returncode == 1, result.stderr
    assert "line 3" in _one_error_line(result.stderr)
    assert _stored(url) == []


def test_append_reads_standard_input(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no file (or "-"), append reads JSON lines from standard input."""
    lines = _ledger_lines(3)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    assert main(["append", "--database", url]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"appended {len(lines)} messages"
    assert [r[2] for r in _stored(url)] == [json.loads(line)["source"] for line in lines]


def test_blank_lines_are_skipped_but_counted(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Blank lines are not messages, but line numbers in errors still count them."""
    good = _ledger_lines(2)
    path = _write_lines(tmp_path, [good[0], "", "   ", good[1], "{bad"])
    assert main(["append", str(path), "--database", url]) == 1
    assert "line 5" in _one_error_line(capsys.readouterr().err)


def test_module_option_accepts_matching_payloads(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --module, payloads that match their registered types are appended."""
    lines = _ledger_lines(5)
    path = _write_lines(tmp_path, lines)
    args = ["append", str(path), "--database", url, "--module", "projections.examples.ledger"]
    assert main(args) == 0
    assert len(_stored(url)) == len(lines)


@pytest.mark.parametrize(
    ("type_", "payload", "reason"),
    [
        ("ledger.deposited", {"account_id": "a", "amount": "lots"}, "amount"),
        ("ledger.deposited", {"account_id": "a"}, "amount"),
        ("ledger.deposited", {"account_id": "a", "amount": 1, "memo": "x"}, "memo"),
        ("ledger.no-such-type", {"account_id": "a"}, "unknown message type"),
    ],
)
def test_module_option_rejects_payloads_that_do_not_match(
    url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    type_: str,
    payload: dict[str, Any],
    reason: str,
) -> None:
    """With --module, a payload that does not decode as its type fails, naming line and type."""
    first = _ledger_lines(1)[0]
    path = _write_lines(tmp_path, [first, _line("ledger", "a", type_, payload)])
    args = ["append", str(path), "--database", url, "--module", "projections.examples.ledger"]
    assert main(args) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "line 2" in line
    assert type_ in line
    assert reason in line
    assert _stored(url) == []


@pytest.mark.parametrize(
    "payload",
    [
        {"account_id": "a", "amount": 1.5},
        {"account_id": "a", "amount": "7"},
        {"account_id": 5, "amount": 1},
    ],
)
def test_module_option_rejects_wrongly_typed_fields(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], payload: dict[str, Any]
) -> None:
    """With --module, a field of the wrong JSON type is rejected, not coerced."""
    path = _write_lines(tmp_path, [_line("ledger", "a", "ledger.deposited", payload)])
    args = ["append", str(path), "--database", url, "--module", "projections.examples.ledger"]
    assert main(args) == 1
    assert _stored(url) == []


def test_module_option_names_a_module_that_cannot_be_imported(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--module with a missing module fails with one line naming it."""
    path = _write_lines(tmp_path, _ledger_lines(1))
    assert main(["append", str(path), "--database", url, "--module", "no_such_mod_q"]) == 1
    assert "no_such_mod_q" in _one_error_line(capsys.readouterr().err)


def test_missing_input_file_is_one_error_line(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing input file fails with one line naming the file."""
    missing = tmp_path / "nope.jsonl"
    assert main(["append", str(missing), "--database", url]) == 1
    assert str(missing) in _one_error_line(capsys.readouterr().err)


# -- configuration --------------------------------------------------------------------------------


def test_unknown_config_key_exits_with_its_path(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown config key fails the command with exit 1 and the key's full path."""
    config = tmp_path / "projections.yaml"
    config.write_text("messaging:\n  consumer:\n    rebalance-intervall: 10s\n", encoding="utf-8")
    assert main(["status", "--config", str(config), "--database", url]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "rebalance-intervall" in err
    assert "messaging.consumer" in err
    assert str(config) in err


# -- db migrate on MySQL ------------------------------------------------------------------------


@pytest.fixture
def mysql_config(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """A config file naming the test MySQL server and a table prefix unique to this test."""
    url = os.environ.get(MYSQL_URL_ENV)
    if not url:
        pytest.skip(f"{MYSQL_URL_ENV} is not set")
    prefix = f"c{uuid.uuid4().hex[:8]}_"
    config = tmp_path / "mysql.yaml"
    config.write_text(f"database: {url}\ntable-prefix: {prefix}\n", encoding="utf-8")
    yield config, url, prefix
    db = Database(url, table_prefix=prefix)
    try:
        with db.engine.begin() as conn:
            for name in inspect(conn).get_table_names():
                if name.startswith(prefix):
                    conn.execute(text(f"DROP TABLE IF EXISTS `{name}`"))
    finally:
        db.dispose()


@pytest.mark.mysql
def test_db_migrate_applies_every_migration_then_is_up_to_date(
    mysql_config: tuple[Path, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`db migrate` applies every migration on a fresh prefix, then reports it up to date."""
    config, url, prefix = mysql_config
    assert main(["status", "--config", str(config)]) == 1
    assert "V1__initial_schema" in _one_error_line(capsys.readouterr().err)

    assert main(["db", "migrate", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == (
        "applied V1__initial_schema, V2__operator_audit, V3__routing_and_sagas, "
        "V4__rebuild_progress, V5__read_model_registry, V6__halt_traceback, V7__generations, "
        "V8__instance_sessions, "
        "V9__audit_command_id, V10__read_model_versions, V11__instance_liveness, "
        "V12__parked_sources, V13__payload_versions"
    )
    assert main(["db", "migrate", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == "schema is up to date"

    assert main(["status", "--json", "--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out) == {"consumers": [], "in_memory": []}
    db = Database(url, table_prefix=prefix)
    try:
        with db.engine.connect() as conn:
            names = {n for n in inspect(conn).get_table_names() if n.startswith(prefix)}
    finally:
        db.dispose()
    assert names == set(db.schema.metadata.tables)


TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} [+-]\d{4}"


def test_audit_prints_readable_times_under_a_header(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`audit` shows each command's local time to the millisecond, not epoch seconds."""
    _declare_ledger(url)
    assert main(["pause", "ledger-balances", "--database", url]) == 0
    capsys.readouterr()
    assert main(["audit", "--database", url]) == 0
    header, line = capsys.readouterr().out.strip().splitlines()
    assert header.split() == ["at", "who", "command", "consumer", "detail"]
    assert re.match(rf"{TIME}  \S+@\S+ +pause +ledger-balances ", line), line


def test_a_type_no_declared_consumer_handles_is_refused_unless_allowed(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --module, a line's type is checked against what the consumers declared in
    the database handle on its topic: a typo is refused naming the closest, and nothing
    of its batch is stored; --allow-unknown-type appends it; another topic is unchecked."""
    _declare_ledger(url)
    typo = _line("ledger", "acct-1", "ledger.deposted", {"account_id": "acct-1", "amount": 5})
    path = _write_lines(tmp_path, [*_ledger_lines(1), typo])
    assert main(["append", str(path), "--database", url]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "line 2: no consumer declared here handles type 'ledger.deposted' on topic " in line
    assert "did you mean 'ledger.deposited'?" in line and "--allow-unknown-type" in line
    assert _stored(url) == []
    assert main(["append", str(path), "--database", url, "--allow-unknown-type"]) == 0
    other = _write_lines(tmp_path, [_line("other", "o", "anything", {})], "other.jsonl")
    assert main(["append", str(other), "--database", url]) == 0
    assert [r.type for r in _stored(url)] == [
        "ledger.account-opened",
        "ledger.deposted",
        "anything",
    ]


def test_operator_commands_print_their_result_and_log_nothing(url: str) -> None:
    """Run as a process, an operator command prints what it did on stdout, and its audit
    log line (INFO) stays out of the terminal unless ``--log-level`` asks for it."""
    _declare_ledger(url)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "projections.cli", *args, "--database", url],
            capture_output=True,
            text=True,
            timeout=60,
        )

    paused = run("pause", "ledger-balances")
    assert (paused.returncode, paused.stdout, paused.stderr) == (0, "paused ledger-balances\n", "")
    logged = run("--log-level", "info", "resume", "ledger-balances")
    assert logged.stdout == "resumed ledger-balances\n"
    assert "event=resume consumer=ledger-balances" in logged.stderr


def test_instances_have_a_header_and_say_when_one_was_last_heard(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`instances` has a header; an instance whose heartbeats stopped (here: no loops) is
    `late` with the seconds since it was last heard, before it turns stale."""
    manager = create_plugin_manager(["projections.examples.ledger"], load_entrypoints=False)
    settings = settings_from_mapping({"database": url, "messaging": {"consumer": FAST}})
    db = Database(url)
    quiet = Instance(db, collect_consumers(manager), settings, manager.hook, name="quiet")
    quiet.start(loops=False)  # registered, then never heard from again
    try:
        report = settings.messaging.consumer

        def late() -> bool:
            [row] = instances_report(db, report)["instances"]
            return bool(row["late"]) and row["live"] and row["last_heard"] >= 0.2

        wait_until(late, timeout=10, what="the instance to be late")
        config = tmp_path / "fast.yaml"
        config.write_text(json.dumps({"messaging": {"consumer": FAST}}), encoding="utf-8")
        assert main(["instances", "--database", url, "--config", str(config)]) == 0
        header, line = capsys.readouterr().out.strip().splitlines()
        assert header.split() == ["name", "state", "last", "heard", "host:pid", "id"]
        assert re.match(r"quiet +late +\d+\.\d s ago ", line), line
    finally:
        quiet.stop()
        db.dispose()
