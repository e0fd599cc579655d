"""Operators act on parked sources: list, retry, skip, evict; audited, fenced, and a
clear error that changes nothing for a request that cannot be met (both backends)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from admin_client import TOKEN_CONFIG, get_json, post, serve
from admin_schemas import COMMAND, CONSUMERS, ERROR, PARKED, check
from clusters import write_config
from parking_app import (
    BROKEN,
    append,
    applied,
    drain,
    items_table,
    parked,
    parking_worker,
    partition,
    reclaim,
    same_partition,
)
from sqlalchemy import Table, select

from messaging import Database, OperationError
from messaging._config import load_settings
from messaging.applying._worker import ConsumerWorker
from projections import _parked_ops as ops
from projections._admin import make_server
from projections._operations import audit_log, resume
from projections.cli import main

WHO = "ops@host"


@pytest.fixture
def table(db: Database) -> Iterator[Table]:
    with items_table(db) as table:
        yield table


def _parked_two(db: Database, table: Table) -> tuple[ConsumerWorker, str, str, dict[str, int]]:
    worker = parking_worker(db, table)
    a, b = same_partition(2)
    pos = append(db, (a, "a1"), (a, "poison-a2"), (b, "b1"), (a, "a3"), (b, "poison-b2"))
    drain(worker)
    return worker, a, b, pos


def _state(db: Database) -> tuple[object, ...]:
    """Everything a refused command must leave as it was."""
    with db.read() as conn:
        return tuple(
            tuple(conn.execute(select(t)).all())
            for t in (db.schema.parked, db.schema.skipped, db.schema.partitions, db.schema.audit)
        )


def test_parked_lists_each_source_with_its_held_messages(db: Database, table: Table) -> None:
    _worker, a, b, pos = _parked_two(db, table)
    report = ops.parked(db, "parked-items", skipped=True)
    by_source = {e["source"]: e for e in report["parked"]}
    assert set(by_source) == {a, b}
    assert by_source[a]["position"] == pos["poison-a2"] and by_source[a]["count"] == 2
    assert by_source[b]["count"] == 1 and "cannot handle poison-b2" in by_source[b]["error"]
    assert "ValueError" in by_source[a]["trace"] and by_source[a]["state"] == "parked"
    assert report["skipped"] == []


def test_retry_of_one_source_applies_it_once_in_order_and_is_audited(
    db: Database, table: Table
) -> None:
    worker, a, b, _pos = _parked_two(db, table)
    BROKEN.clear()
    assert ops.retry(db, "parked-items", source=a, who=WHO, reason="fixed") == [a]
    append(db, (a, "a4"))
    reclaim(db, worker)  # what the fence makes the owner do
    drain(worker)
    assert [n for s, n in applied(db, table) if s == a] == ["a1", "poison-a2", "a3", "a4"]
    assert set(parked(db)) == {b}  # still parked: only a was retried
    [entry] = [e for e in audit_log(db, "parked-items") if e["command"] == "retry"]
    assert entry["who"] == WHO and entry["detail"] == {"reason": "fixed", "sources": [a]}
    assert ops.retry(db, "parked-items", who=WHO) == [b]  # every source left
    reclaim(db, worker)
    drain(worker)
    assert parked(db) == {} and len(applied(db, table)) == 6


def test_a_second_retry_is_told_the_first_won(db: Database, table: Table) -> None:
    _worker, a, _b, _pos = _parked_two(db, table)
    ops.retry(db, "parked-items", source=a, who=WHO)
    before = _state(db)
    with pytest.raises(OperationError, match="is being retried already"):
        ops.retry(db, "parked-items", source=a, who="other@host")
    assert _state(db) == before


@pytest.mark.parametrize(
    ("consumer", "source", "expected"),
    [
        ("parked-items", "s-none", "no source 's-none' in the topics of consumer 'parked-items'"),
        ("nope", "s0", "unknown consumer 'nope'; known consumers: parked-items"),
    ],
)
def test_bad_requests_change_nothing(
    db: Database, table: Table, consumer: str, source: str, expected: str
) -> None:
    _parked_two(db, table)
    before = _state(db)
    for command in (ops.retry, ops.skip, ops.evict):
        with pytest.raises(OperationError) as raised:
            command(db, consumer, source=source, who=WHO)
        assert str(raised.value).startswith(expected)
    assert _state(db) == before


def test_retrying_a_source_that_is_not_parked_is_refused(db: Database, table: Table) -> None:
    worker = parking_worker(db, table)
    [a] = same_partition(1)
    append(db, (a, "fine"))
    drain(worker)
    with pytest.raises(OperationError) as raised:
        ops.retry(db, "parked-items", source=a, who=WHO)
    assert str(raised.value) == f"source '{a}' of consumer 'parked-items' is not parked"
    with pytest.raises(OperationError) as raised:
        ops.retry(db, "parked-items", who=WHO)
    assert str(raised.value) == "consumer 'parked-items' has no parked source"


def test_skip_on_a_consumer_that_halts_instead_says_so(db: Database, table: Table) -> None:
    worker = parking_worker(db, table, max_sources=None)
    [a] = same_partition(1)
    pos = append(db, (a, "poison-1"))
    drain(worker)
    assert partition(db, 0)[0] == "halted"
    before = _state(db)
    with pytest.raises(OperationError) as raised:
        ops.skip(db, "parked-items", source=a, who=WHO)
    assert str(raised.value).endswith(
        "halts its partition on a failure instead (on-failure: halt-partition): "
        "see `projections resume --skip-poison`"
    )
    assert _state(db) == before
    # resume --skip-poison's skip is listed with the skipped messages
    resume(db, "parked-items", who=WHO, skip_poison=True)
    [skipped] = ops.parked(db, "parked-items", skipped=True)["skipped"]
    assert (skipped["position"], skipped["source"], skipped["who"]) == (pos["poison-1"], a, WHO)


def test_skip_records_the_head_and_retries_the_rest(db: Database, table: Table) -> None:
    worker, a, _b, pos = _parked_two(db, table)
    BROKEN.clear()
    skipped = ops.skip(db, "parked-items", source=a, who=WHO, reason="bad data")
    assert skipped == {"source": a, "position": pos["poison-a2"], "type": "test.poison.item"}
    reclaim(db, worker)
    drain(worker)
    assert [n for s, n in applied(db, table) if s == a] == ["a1", "a3"]
    listed = ops.parked(db, "parked-items", skipped=True)
    assert [e["source"] for e in listed["parked"]] != [a]
    assert [(e["position"], e["who"]) for e in listed["skipped"]] == [(pos["poison-a2"], WHO)]
    assert a not in parked(db)


def test_evict_drops_the_held_messages_and_the_source_flows_again(
    db: Database, table: Table
) -> None:
    worker, a, _b, pos = _parked_two(db, table)
    assert ops.evict(db, "parked-items", source=a, who=WHO, reason="test data") == 2
    append(db, (a, "a4"))
    reclaim(db, worker)
    drain(worker)
    assert [n for s, n in applied(db, table) if s == a] == ["a1", "a4"]
    skipped = ops.parked(db, "parked-items", skipped=True)["skipped"]
    assert [e["position"] for e in skipped] == [pos["poison-a2"], pos["a3"]]
    [entry] = [e for e in audit_log(db, "parked-items") if e["command"] == "evict"]
    assert entry["detail"]["evicted"] == 2 and entry["detail"]["reason"] == "test data"


def test_the_cli_lists_retries_and_refuses_in_one_line(
    db: Database, table: Table, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worker, a, b, pos = _parked_two(db, table)
    config = ["--config", str(write_config(tmp_path / "c.yaml", db))]
    assert main(["parked", "parked-items", "--json", *config]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {e["source"]: e["count"] for e in report["parked"]} == {a: 2, b: 1}
    assert main(["status", "--json", *config]) == 0
    status = json.loads(capsys.readouterr().out)
    check(status, CONSUMERS)
    [consumer] = status["consumers"]
    assert consumer["parked_sources"] == 2 and consumer["partitions"][0]["parked_sources"] == 2
    assert main(["status", *config]) == 0
    assert "2 parked sources (projections parked parked-items)" in capsys.readouterr().out
    assert main(["parked", "parked-items", *config]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith(
        f"{a}  partition 0  from position {pos['poison-a2']}"
    )

    assert main(["retry", "parked-items", "--source", "nobody", *config]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no source 'nobody' in the topics" in err
    with pytest.raises(SystemExit):  # --source is required
        main(["skip", "parked-items", *config])
    assert "required: --source" in capsys.readouterr().err

    BROKEN.clear()
    assert main(["retry", "parked-items", "--source", a, "--reason", "fixed", *config]) == 0
    assert capsys.readouterr().out == f"retrying 1 parked sources of parked-items: {a}\n"
    assert main(["evict", "parked-items", "--source", b, *config]) == 0
    assert capsys.readouterr().out == f"evicted 1 parked messages of {b} from parked-items\n"
    reclaim(db, worker)
    drain(worker)
    assert main(["parked", "parked-items", "--skipped", *config]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "no parked source in parked-items"
    assert out[1].startswith(f"skipped position {pos['poison-b2']}  {b}")
    assert [n for s, n in applied(db, table) if s == a] == ["a1", "poison-a2", "a3"]
    assert main(["audit", "parked-items", "--json", *config]) == 0
    commands = [e["command"] for e in json.loads(capsys.readouterr().out)["audit"]]
    assert commands == ["retry", "evict"]


def test_the_admin_lists_and_acts_with_the_token(
    db: Database, table: Table, tmp_path: Path
) -> None:
    _worker, a, b, pos = _parked_two(db, table)
    settings = load_settings(str(write_config(tmp_path / "c.yaml", db, extra=TOKEN_CONFIG)))
    server = make_server(db, settings, "127.0.0.1", 0)
    url, thread = serve(server)
    try:
        consumer = f"{url}/admin/consumers/parked-items"
        status, listed = get_json(f"{consumer}/parked")
        assert status == 200 and check(listed, PARKED)["consumer"] == "parked-items"
        assert [e["source"] for e in listed["parked"]] == [a, b]
        before = _state(db)
        assert post(f"{consumer}/retry", {"source": a}, token=None)[0] == 401
        status, error = post(f"{consumer}/skip", {"reason": "no source"})
        assert status == 409 and check(error, ERROR)["error"].startswith("skip needs the")
        assert post(f"{consumer}/retry", {"source": 3})[0] == 400
        assert _state(db) == before

        status, answer = post(f"{consumer}/skip", {"source": a, "reason": "bad data"})
        assert status == 200 and check(answer, COMMAND)["skipped"]["position"] == pos["poison-a2"]
        status, answer = post(f"{consumer}/retry", {"source": b})
        assert status == 200 and check(answer, COMMAND)["retrying"] == [b]
        status, answer = post(f"{consumer}/retry", {"source": b})
        assert status == 409 and "being retried already" in answer["error"]
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
    [skip] = [e for e in audit_log(db, "parked-items") if e["command"] == "skip"]
    assert skip["who"] == "admin token@127.0.0.1" and skip["detail"]["reason"] == "bad data"


def test_skipped_messages_are_applied_later_once_in_order(db: Database, table: Table) -> None:
    """Skipped is not forgotten: once the handler is fixed, ``retry --skipped`` applies a
    source's skipped messages (by skip and evict) once, in their order, and forgets them."""
    worker, a, _b, pos = _parked_two(db, table)
    ops.evict(db, "parked-items", source=a, who=WHO)  # poison-a2 and a3 recorded as skipped
    with pytest.raises(OperationError) as raised:
        ops.retry_skipped(db, "parked-items", source="s-none", who=WHO)
    assert str(raised.value) == "source 's-none' of consumer 'parked-items' has no skipped message"
    BROKEN.clear()
    reclaim(db, worker)
    drain(worker)
    assert ops.retry_skipped(db, "parked-items", source=a, who=WHO, reason="fixed") == 2
    before = _state(db)
    with pytest.raises(OperationError, match="is parked or being retried"):
        ops.retry_skipped(db, "parked-items", source=a, who=WHO)
    assert _state(db) == before
    append(db, (a, "a4"))
    reclaim(db, worker)
    drain(worker)
    assert [n for s, n in applied(db, table) if s == a] == ["a1", "poison-a2", "a3", "a4"]
    listed = ops.parked(db, "parked-items", skipped=True)
    assert [e["source"] for e in listed["skipped"]] == [] and listed["parked"][0]["source"] != a
    with pytest.raises(OperationError, match="has no skipped message"):  # applied once
        ops.retry_skipped(db, "parked-items", source=a, who=WHO)
    [entry] = [e for e in audit_log(db, "parked-items") if e["command"] == "retry --skipped"]
    assert entry["detail"]["positions"] == [pos["poison-a2"], pos["a3"]]
