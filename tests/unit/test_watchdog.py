"""The watchdog's verdict on a loop, with a clock of the test's own: a loop that beats is
left alone, one stuck past its bound ends the process once with EXIT_STUCK, and a stuck
loop is reported with where it is stuck."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from messaging.runtime._watchdog import EXIT_STUCK, Watchdog, _where


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _blocked_loop(
    watchdog: Watchdog, registered: threading.Event, release: threading.Event
) -> None:
    watchdog.watch("rebalance", 10.0)
    registered.set()
    release.wait()  # stuck here, as in a hook that never returns


def test_a_loop_stuck_past_its_bound_ends_the_process_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, exits = Clock(), list[int]()
    watchdog = Watchdog("instance i", answer_bound=lambda: None, clock=clock, exit=exits.append)
    registered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_blocked_loop, args=(watchdog, registered, release))
    thread.start()
    try:
        registered.wait(5)
        clock.now += 9.0
        watchdog.look(sys._current_frames())
        watchdog.beat("rebalance")  # a round: the bound counts from here
        clock.now += 9.5
        watchdog.look(sys._current_frames())
        assert exits == []
        clock.now += 1.0
        watchdog.look(sys._current_frames())
        watchdog.look(sys._current_frames())
        assert exits == [EXIT_STUCK]
        [record] = [r for r in caplog.records if r.name == "messaging.runtime.watchdog"]
        assert "its rebalance loop made no progress for 10.5 s" in record.getMessage()
        assert "_blocked_loop" in record.getMessage()
    finally:
        release.set()
        thread.join()


def test_a_loop_whose_thread_ended_is_not_judged() -> None:
    clock, exits = Clock(), list[int]()
    watchdog = Watchdog("instance i", answer_bound=lambda: None, clock=clock, exit=exits.append)
    registered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_blocked_loop, args=(watchdog, registered, release))
    thread.start()
    registered.wait(5)
    release.set()
    thread.join()
    clock.now += 60.0
    watchdog.look(sys._current_frames())
    assert exits == []


def test_overdue_names_the_loops_past_their_bound() -> None:
    """What the liveness probe asks: the loops that have not beaten within their bound."""
    clock = Clock()
    watchdog = Watchdog("instance i", answer_bound=lambda: None, clock=clock, exit=print)
    watchdog.watch("heartbeat", 5.0)
    watchdog.watch("pulse", 2.0)
    assert watchdog.overdue() == []
    clock.now += 3.0
    watchdog.beat("heartbeat")
    assert watchdog.overdue() == ["pulse"]
    clock.now += 5.5
    assert watchdog.overdue() == ["heartbeat", "pulse"]
    watchdog.beat("pulse")
    assert watchdog.overdue() == ["heartbeat"]


def test_where_names_the_innermost_frames_outside_the_libraries() -> None:
    """A thread waiting inside the standard library (as a handler waits inside a driver)
    is named by the handler's own frames, innermost first."""
    release = threading.Event()

    def handler() -> None:
        release.wait()

    thread = threading.Thread(target=handler)
    thread.start()
    try:
        assert thread.ident is not None
        for _ in range(500):  # until the thread is inside the wait
            where = _where(sys._current_frames()[thread.ident])
            if where.startswith("handler"):
                break
            time.sleep(0.01)
        assert where.startswith("handler (test_watchdog.py:"), where
        assert "threading.py" not in where
    finally:
        release.set()
        thread.join()
