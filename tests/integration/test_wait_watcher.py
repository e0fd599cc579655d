"""The shared watcher on both backends: many concurrent waits on one database cost what
one does while nothing moves (statements counted on the engine), and all of them return,
each once its own write shows, when an instance applies them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from clusters import owned_by, start_instance, stop_instance, wait_until, write_config
from ledger_waits import CONSUMER, deposit, ledger_instance
from sqlalchemy import event, select

from messaging import (
    Appended,
    Database,
    MessageStore,
    Progress,
    wait_for,
)
from messaging.waits._watcher import watcher_for
from projections.examples import ledger

WAITERS = 200


@contextmanager
def _counted(db: Database) -> Iterator[list[int]]:
    """The number of statements ``db``'s engine sends meanwhile (in a one-item list)."""
    count = [0]

    def counted(*_: object) -> None:
        count[0] += 1

    event.listen(db.engine, "before_cursor_execute", counted)
    try:
        yield count
    finally:
        event.remove(db.engine, "before_cursor_execute", counted)


def _statements_per_round(db: Database, rounds: int = 10) -> float:
    """Statements per watcher round while nothing moves, over ``rounds`` rounds."""
    watcher = watcher_for(db)
    start = watcher.rounds + 1
    wait_until(lambda: watcher.rounds >= start, timeout=30, what="a round")
    with _counted(db) as count:
        first = watcher.rounds
        wait_until(lambda: watcher.rounds >= first + rounds, timeout=60, what="rounds")
        done = watcher.rounds - first
    return count[0] / done


def test_many_waits_share_the_watcher_s_reads_and_each_returns_once_applied(db: Database) -> None:
    declared = ledger_instance(db)
    declared.start(loops=False)
    declared.stop()
    results: dict[str, Progress | BaseException] = {}

    def wait(account: str, appended: Appended) -> None:
        try:
            results[account] = wait_for(db, appended.token, CONSUMER, timeout=120)
        except BaseException as exc:
            results[account] = exc

    one = threading.Thread(target=wait, args=("solo", deposit(db, "solo")))
    one.start()
    wait_until(lambda: watcher_for(db).rounds >= 2, timeout=30, what="the first rounds")
    alone = _statements_per_round(db)
    threads = [
        threading.Thread(target=wait, args=(f"w{n}", deposit(db, f"w{n}"))) for n in range(WAITERS)
    ]
    for thread in threads:
        thread.start()
    # once every wait had its first full check, a round is one statement however many wait
    wait_until(
        lambda: all(w.seen is not None for w in list(watcher_for(db)._watches)),
        timeout=60,
        what="every wait checked once",
    )
    crowded = _statements_per_round(db)
    assert len(watcher_for(db)._watches) == WAITERS + 1
    # one query (and SQLite's BEGIN of the read) per round, however many wait
    assert alone <= 2.0 and crowded <= alone * 1.1, (alone, crowded)

    instance = ledger_instance(db)
    instance.start()
    try:
        for thread in [one, *threads]:
            thread.join(120)
    finally:
        instance.stop()
    failed = {a: r for a, r in results.items() if not isinstance(r, Progress)}
    assert not failed and len(results) == WAITERS + 1, failed
    table = db.read_model(ledger.balances)
    with db.read() as conn:
        shown = dict(conn.execute(select(table.c.account_id, table.c.entries)).all())
    assert all(shown.get(account) == 1 for account in results)


def _wait_slowly(db: Database, appended: Appended, returned: list[float]) -> None:
    """Wait with a poll interval of 10 s; note when it returned."""
    wait_for(db, appended.token, CONSUMER, timeout=30, poll_interval=10)
    returned.append(time.monotonic())


def test_a_wait_returns_right_after_the_batch_in_this_process_commits(db: Database) -> None:
    """An instance in the same process kicks the watcher when its batch commits: a wait
    checked once before its append committed returns well within the watcher's poll
    interval (here 10 s) once the append commits and is applied."""
    instance = ledger_instance(db)
    instance.start()
    watcher = watcher_for(db)
    try:
        for n in range(3):
            returned: list[float] = []
            with db.transaction() as conn:
                appended = MessageStore(db).append(
                    conn, ledger.TOPIC, f"fast-{n}", [ledger.Deposited(f"fast-{n}", 1)]
                )
                waiting = threading.Thread(target=_wait_slowly, args=(db, appended, returned))
                waiting.start()
                wait_until(
                    lambda: any(w.seen is not None for w in list(watcher._watches)),
                    timeout=30,
                    what="the wait checked before the commit",
                )
            committed = time.monotonic()
            waiting.join(30)
            assert returned and returned[0] - committed < 5
    finally:
        instance.stop()


@pytest.mark.multiprocess
def test_a_wait_returns_right_after_a_batch_in_another_process_on_this_host_commits(
    db: Database, tmp_path: Path
) -> None:
    """A ``projections run`` process on this host wakes the watcher here when its batch
    commits (a datagram to the watcher's socket): waits polled only every 10 s return
    within a fraction of that once their appends are applied."""
    process = start_instance(write_config(tmp_path / "config.yaml", db), "applier")
    try:
        wait_until(lambda: owned_by(db, {"applier"}), timeout=60, what="the instance to own")
        for n in range(5):
            appended = deposit(db, f"far-{n}")
            committed = time.monotonic()
            wait_for(db, appended.token, CONSUMER, timeout=30, poll_interval=10)
            assert time.monotonic() - committed < 5
    finally:
        assert stop_instance(process) == 0
