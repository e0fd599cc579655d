"""Real processes: a poison message parks its source while every other source flows; the
parked source survives a SIGKILL of its owner, an owner SIGKILLed inside the park's
transaction commits nothing of it, and a retry from the CLI, whose owner is SIGKILLed
inside it, applies its held messages exactly once each, in their original order (checked
per source against its sequence), on both backends."""

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


@pytest.fixture
def broken(db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file whose existence makes the handler fail on poison (unlink it: fixed); the
    read model's table created."""
    path = tmp_path / "broken"
    path.touch()
    monkeypatch.setenv("PARKED_SEQ_BROKEN", str(path))
    with db.transaction() as conn:
        app.metadata.create_all(conn)
    return path


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


def _blocking(source: str, seq: int, reached: Path) -> dict[str, str]:
    """The environment of an instance whose handler stops for good inside the transaction
    that first handles ``source``'s message ``seq``, once it has created ``reached``."""
    return {"PARKED_SEQ_BLOCK": f"{source}:{seq}", "PARKED_SEQ_REACHED": str(reached)}


def _exactly_once_in_order(db: Database, last: int) -> None:
    """Every source's seqs 1..``last`` applied once each (the primary key refuses a second
    apply), each as the seq-th of its source."""
    assert app.applied_seqs(db) == {s: list(range(1, last + 1)) for s in SOURCES}
    with db.read() as conn:
        ranks = conn.execute(select(app.applied.c.seq, app.applied.c.rank)).all()
    assert all(seq == rank for seq, rank in ranks)


def _retry_killed_then_finished(
    db: Database, config: Path, broken: Path, names: tuple[str, str], *, block_at: int, held: int
) -> None:
    """The first instance of ``names`` holds (or parks) the poisoned source's ``held``
    messages; the handler is fixed and the source retried, the instance SIGKILLed inside
    the retry (at seq ``block_at``); the second finishes the retry, then applies two more
    seqs of every source: each source's messages once each, in their order."""
    reached = config.parent / f"retrying-{names[0]}"
    owner = start_instance(
        config, names[0], "parked_seq_app", env=_blocking(POISONED, block_at, reached)
    )
    try:
        wait_until(lambda: lag(db, "parked-seq") == 0, timeout=60, what=f"{names[0]} to hold")
        assert _parked(config) == {POISONED: held}
        broken.unlink()  # the handler is fixed
        out = cli(config, "retry", "parked-seq", "--source", POISONED, "--reason", "fixed")
        assert out == f"retrying 1 parked sources of parked-seq: {POISONED}\n"
        wait_until(reached.exists, timeout=60, what="the retry's transaction")
    finally:
        owner.kill()
        owner.wait(timeout=10)
    assert app.applied_seqs(db)[POISONED] == [1, 2, 3]
    last = held + 3
    finisher = start_instance(config, names[1], "parked_seq_app")
    try:
        wait_until(lambda: not _parked(config), timeout=60, what="the retry after the kill")
        _append(db, range(last + 1, last + 3))
        wait_until(lambda: lag(db, "parked-seq") == 0, timeout=60, what="the last batches")
    finally:
        assert stop_instance(finisher) == 0
    _exactly_once_in_order(db, last + 2)


def test_a_poison_parks_its_source_survives_sigkill_and_retries_once_in_order(
    db: Database, tmp_path: Path, broken: Path
) -> None:
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

    # The retry: its owner is SIGKILLed inside it (at the seventh of its held messages).
    _retry_killed_then_finished(db, config, broken, ("k3", "k4"), block_at=10, held=20)


def test_an_instance_killed_while_parking_and_while_retrying_applies_each_once_in_order(
    db: Database, tmp_path: Path, broken: Path
) -> None:
    """SIGKILL inside the transaction that parks the poisoned source (at a message of
    another source after the poison, applied in the park's commit), then inside the retry:
    nothing of either is committed, the next instance parks and retries again, and every
    source's messages are applied once each in their order."""
    extra = "projections:\n  on-failure: park-source\n"
    config = write_config(tmp_path / "config.yaml", db, batch_size=200, extra=extra)
    neighbour = next(  # after the poisoned source in the appends, in its partition
        s
        for s in SOURCES[SOURCES.index(POISONED) + 1 :]
        if partition_of(s, 4) == partition_of(POISONED, 4)
    )
    _append(db, range(1, 11), poison_at=4)  # one batch per partition

    parking = tmp_path / "parking"
    first = start_instance(config, "k1", "parked_seq_app", env=_blocking(neighbour, 4, parking))
    try:
        wait_until(parking.exists, timeout=60, what="the park's transaction")
    finally:
        first.kill()
        first.wait(timeout=10)
    assert _parked(config) == {}
    # Nothing of the park's transaction (from the poison on): on SQLite the messages
    # before it may have committed before it, a batch committing before a handler that
    # reads what an earlier message of it wrote (ConsumerWorker._commit_before).
    applied = app.applied_seqs(db)
    assert all(seq < 4 for source in (POISONED, neighbour) for seq in applied.get(source, []))

    _retry_killed_then_finished(db, config, broken, ("k2", "k3"), block_at=8, held=7)


def test_one_failing_source_more_than_max_parked_sources_halts_the_partition(
    db: Database, tmp_path: Path, broken: Path
) -> None:
    """With ``max-parked-sources: 1``, a second failing source of a partition halts it
    (status shows the halt and the parked source); other partitions go on."""
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
