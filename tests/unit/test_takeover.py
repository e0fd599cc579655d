"""The parts of a batch's takeover past its apply timeout, each on its own (a fake clock;
real threads where a thread is the point): the deadline abandoned exactly once (or ended
by its own thread first), the hung thread's partitions freed by the one that took over,
a lane abandoned and replaced, and a split batch's rest."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import create_engine

from messaging._errors import ApplyTimedOut
from messaging.applying._apply_timeout import Abandoned, ApplyDeadlines, Deadline
from messaging.applying._batch import Batch
from messaging.applying._holdings import Holdings
from messaging.applying._lanes import Lanes
from messaging.distribution._ownership import Claim


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def conn() -> Any:
    engine = create_engine("sqlite://")
    with engine.connect() as connection:
        yield connection
    engine.dispose()


def _look(deadlines: ApplyDeadlines) -> None:
    deadlines.look([], lambda _thread: "handle (app.py:7)")


def test_a_batch_past_its_deadline_is_abandoned_once_and_its_thread_commits_nothing(
    conn: Any,
) -> None:
    clock = Clock()
    deadlines = ApplyDeadlines("instance t", clock)
    taken: list[Deadline] = []
    with pytest.raises(Abandoned), deadlines.bound(conn, 2.0, "c", [0, 1], taken.append):
        _look(deadlines)  # not yet past: nothing happens
        assert taken == []
        clock.now += 2.5
        _look(deadlines)
        _look(deadlines)
        assert len(taken) == 1 and taken[0].abandoned and taken[0].where == "handle (app.py:7)"
        # the block ends normally, as a handler that returns late would: still abandoned
    assert deadlines.stuck_batches() == []  # left: no longer running


def test_a_batch_that_ends_before_the_look_is_not_abandoned(conn: Any) -> None:
    clock = Clock()
    deadlines = ApplyDeadlines("instance t", clock)
    taken: list[Deadline] = []
    bound = deadlines.bound(conn, 2.0, "c", [0], taken.append)
    with pytest.raises(ApplyTimedOut), bound as deadline:
        clock.now += 2.5
        deadline.check(7)  # its own thread sees the deadline first: fails as before
    _look(deadlines)
    assert taken == []


def test_an_abandoned_batch_still_running_makes_its_partition_stuck(conn: Any) -> None:
    clock = Clock()
    deadlines = ApplyDeadlines("instance t", clock)

    def take_over(deadline: Deadline) -> None:
        deadline.partitions = (1,)  # the hung message's partition alone

    with pytest.raises(Abandoned), deadlines.bound(conn, 2.0, "c", [0, 1, 2], take_over):
        clock.now += 2.5
        _look(deadlines)
        assert deadlines.stuck_batches() == []  # within as long again as the timeout
        clock.now += 2.0
        [stuck] = deadlines.stuck_batches()
        assert (stuck.consumer, stuck.partitions) == ("c", (1,))
        assert "partitions 1)" in str(stuck) and "in handle (app.py:7)" in str(stuck)


def _claims(*partitions: int) -> dict[int, Claim]:
    return {p: Claim(partition=p, epoch=1, checkpoint=0) for p in partitions}


def test_the_hung_thread_frees_only_the_partition_it_kept() -> None:
    holdings = Holdings("c")
    holdings.claims.update(_claims(0, 1, 2))
    assert holdings.take(holdings.claims) == _claims(0, 1, 2)
    hung = threading.Thread(target=lambda: holdings.finish([0, 1, 2]))
    hung.start()  # (started first: its ident is known)
    hung.join()  # it returned at once here: an ordinary batch end
    assert holdings.idle() == _claims(0, 1, 2)

    assert holdings.take(holdings.claims) == _claims(0, 1, 2)
    returned = threading.Event()
    done = threading.Event()

    def batch() -> None:
        returned.wait()
        holdings.finish([0, 1, 2])
        done.set()

    thread = threading.Thread(target=batch)
    thread.start()
    assert thread.ident is not None
    holdings.abandon(thread.ident, [1])
    holdings.finish([0, 2])  # the thread that took over
    assert holdings.idle() == _claims(0, 2)
    assert holdings.take(holdings.claims) == _claims(0, 2)  # a new batch of them
    returned.set()  # the hung thread returns: it frees 1 only, not the new batch's
    assert done.wait(10)
    assert holdings.idle() == _claims(1)


def test_an_abandoned_lane_is_replaced_and_never_waited_for() -> None:
    lanes = Lanes(2)
    release = threading.Event()
    started: list[int] = []

    def hung() -> int:
        started.append(threading.get_ident())
        release.wait()
        return 1

    lanes.submit(hung, lambda: None)
    lanes.submit(lambda: 2, lambda: None)
    assert lanes.wait(10) == 2  # the other lane ended; the hung one still runs
    assert lanes.free() == 1
    lanes.abandon(started[0])
    assert lanes.free() == 2 and not lanes.running()
    lanes.submit(lambda: 3, lambda: None)
    lanes.submit(lambda: 4, lambda: None)
    assert lanes.wait(10) == 7  # two lanes apply though one thread still hangs
    lanes.shutdown()  # does not wait for the abandoned one
    release.set()


def _row(position: int, partition: int) -> tuple[object, ...]:
    return (position, "t", "{}", 1, partition)


def test_a_split_batch_goes_on_with_its_rest_and_moves_past_the_read_at_its_end() -> None:
    rows = [_row(3, 0), _row(5, 1), _row(8, 0)]
    batch = Batch(_claims(0, 1), rows, through=12)
    first = rows[:1]
    rest = batch.rest(first)
    assert batch.checkpoint(first) == 3  # not past the read: the rest is to apply
    assert rest is not None and rest.rows == rows[1:] and rest.through == 12
    assert {p: c.checkpoint for p, c in rest.claims.items()} == {0: 3, 1: 3}
    assert rest.envelopes is batch.envelopes  # loaded once for the whole read
    assert rest.rest(rows[1:]) is None
    assert rest.checkpoint(rows[1:]) == 12  # all of it: past the whole read
    assert Batch(_claims(0), None).rest(first) is None  # read in its transaction
