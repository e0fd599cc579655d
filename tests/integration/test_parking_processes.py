"""Real processes: a poison message parks its source while every other source flows; the
parked source survives a SIGKILL of its owner, and a retry from the CLI, whose owner is
SIGKILLed inside it, applies its held messages exactly once each, in their original order
(checked per source against its sequence), on both backends."""

from __future__ import annotations

import json
from pathlib import Path

import parked_seq_app as app
import pytest
from clusters import cli, lag, start_instance, stop_instance, wait_until, write_config
from sqlalchemy import MetaData, select

from messaging import Database, MessageStore
from messaging.store._rows import partition_of

pytestmark = pytest.mark.multiprocess

SOURCES = [f"src-{n}" for n in range(12)]
POISONED = "src-5"


@pytest.fixture
def read_model_metadata() -> list[MetaData]:
    return [app.metadata]


def _append(db: Database, steps: range, poison_at: int | None = None) -> None:
    store = MessageStore(db)
    with db.transaction() as conn:
        for seq in steps:
            for source in SOURCES:
                poison = source == POISONED and seq == poison_at
                store.append(conn, "seq", source, [app.Step(seq, poison)])


def _parked(config: Path) -> dict[str, int]:
    report = json.loads(cli(config, "parked", "parked-seq", "--json"))
    return {e["source"]: e["count"] for e in report["parked"]}


def test_a_poison_parks_its_source_survives_sigkill_and_retries_once_in_order(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken"
    broken.touch()
    monkeypatch.setenv("PARKED_SEQ_BROKEN", str(broken))
    with db.transaction() as conn:
        app.metadata.create_all(conn)
    config = write_config(
        tmp_path / "config.yaml",
        db,
        batch_size=7,
        extra="projections:\n  on-failure: park-source\n",
    )
    _append(db, range(1, 11), poison_at=4)

    first = start_instance(config, "k1", "parked_seq_app")
    try:
        wait_until(lambda: lag(db, "parked-seq") == 0, timeout=60, what="the first batches")
        assert _parked(config) == {POISONED: 7}  # 4..10 held
        seen = app.applied_seqs(db)
        assert seen.pop(POISONED) == [1, 2, 3]
        assert seen == {s: list(range(1, 11)) for s in SOURCES if s != POISONED}
        _append(db, range(11, 21))  # the others flow, the parked source's are held
        wait_until(lambda: lag(db, "parked-seq") == 0, timeout=60, what="the second batches")
    finally:
        first.kill()  # SIGKILL while a source is parked
        first.wait(timeout=10)

    second = start_instance(config, "k2", "parked_seq_app")
    try:
        _append(db, range(21, 24))
        wait_until(lambda: lag(db, "parked-seq") == 0, timeout=60, what="the takeover")
        assert _parked(config) == {POISONED: 20}  # 4..23: still held, none applied
        assert app.applied_seqs(db)[POISONED] == [1, 2, 3]
    finally:
        assert stop_instance(second) == 0

    # The retry: its owner is SIGKILLed inside it (its slow effects half done).
    effects = tmp_path / "effects.txt"
    effects.touch()
    slow = {"PARKED_SEQ_EFFECTS": str(effects), "PARKED_SEQ_SLOW_SOURCE": POISONED}
    third = start_instance(config, "k3", "parked_seq_app", env=slow)
    try:
        wait_until(lambda: lag(db, "parked-seq") == 0, timeout=60, what="k3 to hold")
        broken.unlink()  # the handler is fixed
        out = cli(config, "retry", "parked-seq", "--source", POISONED, "--reason", "fixed")
        assert out == f"retrying 1 parked sources of parked-seq: {POISONED}\n"
        wait_until(lambda: len(effects.read_text().split()) >= 5, timeout=60, what="the retry")
    finally:
        third.kill()
        third.wait(timeout=10)
    assert app.applied_seqs(db)[POISONED] == [1, 2, 3], "the kill did not land inside the retry"
    fourth = start_instance(config, "k4", "parked_seq_app")
    try:
        wait_until(lambda: not _parked(config), timeout=60, what="the retry after the kill")
        _append(db, range(24, 26))
        wait_until(lambda: lag(db, "parked-seq") == 0, timeout=60, what="the last batches")
    finally:
        assert stop_instance(fourth) == 0
    # Exactly once (the primary key refuses a second apply) and in each source's order.
    assert app.applied_seqs(db) == {s: list(range(1, 26)) for s in SOURCES}
    with db.read() as conn:
        ranks = conn.execute(select(app.applied.c.seq, app.applied.c.rank)).all()
    assert all(seq == rank for seq, rank in ranks)


def test_one_failing_source_more_than_max_parked_sources_halts_the_partition(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``max-parked-sources: 1``, a second failing source of a partition halts it
    (status shows the halt and the parked source); other partitions go on."""
    broken = tmp_path / "broken"
    broken.touch()
    monkeypatch.setenv("PARKED_SEQ_BROKEN", str(broken))
    with db.transaction() as conn:
        app.metadata.create_all(conn)
    extra = "projections:\n  on-failure: park-source\n  max-parked-sources: 1\n"
    config = write_config(tmp_path / "config.yaml", db, batch_size=7, extra=extra)
    first, second = [s for s in SOURCES if partition_of(s, 4) == partition_of(POISONED, 4)][:2]
    store = MessageStore(db)
    with db.transaction() as conn:
        for seq in range(1, 6):
            for source in SOURCES:
                poison = source in (first, second) and seq == 2
                store.append(conn, "seq", source, [app.Step(seq, poison)])
    process = start_instance(config, "k1", "parked_seq_app")
    try:

        def halted() -> bool:
            report = json.loads(cli(config, "status", "--json"))
            return any(
                p["status"] == "halted"
                for c in report["consumers"]
                if c["name"] == "parked-seq"
                for p in c["partitions"]
            )

        wait_until(halted, timeout=60, what="the partition to halt")
        assert list(_parked(config)) == [first]
        others = {s for s in SOURCES if partition_of(s, 4) != partition_of(first, 4)}
        wait_until(
            lambda: all(app.applied_seqs(db).get(s) == [1, 2, 3, 4, 5] for s in others),
            timeout=60,
            what="the other partitions",
        )
    finally:
        assert stop_instance(process) == 0
    assert app.applied_seqs(db)[second] == [1]  # halted right before its poison
