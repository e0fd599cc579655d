"""An instance that is stuck notices it: database waits that outlast the answer bound are
abandoned, and a loop of its own that makes no progress ends the process.

The answer bound (:mod:`messaging.store._answers`) ends every MySQL/MariaDB wait the
driver makes; the watchdog is the second line, for whatever slips past it. A thread looks
once a second:

- **A database wait** (a thread inside one MySQL/MariaDB socket read, write or connect)
  that lasts longer than the answer bound plus a grace: its connection is abandoned (the
  socket shut down), so the wait fails at once as a lost connection (2013), an error of
  unknown outcome that the loop retries on a new connection, as after any lost connection.
- **A loop of the instance's own** (heartbeat, rebalance, pulse) beats after each round.
  One that has not beaten for longer than a round can take (its interval, every retry of
  ``conflict-retry`` each waiting the answer bound, and stale-instance-timeout on top),
  while not inside a database wait, is stuck where nothing can free it (a plugin hook
  that never returns, a name lookup that hangs). It is reported once at ERROR with where
  it is stuck, and the process exits with :data:`EXIT_STUCK`, so that its supervisor
  (``projections run --workers``, systemd, Kubernetes) starts it again; the others take
  its partitions over as from any instance that died.

Apply loops are not beaten: a batch runs the application's handlers, whose time is
bounded by its consumer's ``apply-timeout`` instead: at each look, the batches past it
have their running statement interrupted and are taken over
(:mod:`messaging.applying._apply_timeout`). A handler that still does not return makes
its instance not live; with :attr:`Watchdog.exit_when_stuck` (a supervised worker) the
process exits with :data:`EXIT_STUCK` then, so that its supervisor starts it again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import attrs

from messaging._bounds import lock_wait_bound
from messaging._settings import ConsumerSettings
from messaging.applying._apply_timeout import ApplyDeadlines
from messaging.store._database import Database

__all__ = ["EXIT_STUCK", "Watchdog", "round_bound"]

log = logging.getLogger("messaging.runtime.watchdog")

EXIT_STUCK = 70
"""The exit code of a process whose loop was stuck (``EX_SOFTWARE``)."""
GRACE = 2.0
"""Seconds a database wait may outlast the answer bound before it is abandoned."""
_DRIVER = os.path.join("pymysql", "connections.py")
_WAITS = frozenset({"_read_bytes", "_write_bytes", "connect"})
"""PyMySQL's functions that wait for the server."""


def round_bound(settings: ConsumerSettings, interval: float, *, db: Database) -> float:
    """Seconds a round of an instance's loop that runs every ``interval`` takes at most,
    with room to spare: the interval, every retry of ``conflict-retry`` waiting as long as
    a database wait may (``db``'s answer bound as it is now, or the lock-wait bound on
    SQLite), and stale-instance-timeout on top. A loop past it is stuck."""
    wait = db.answer_timeout or lock_wait_bound(settings.stale_instance_timeout)
    retry = settings.conflict_retry
    attempts = retry.max_retries + 1
    return interval + attempts * (wait + retry.max_delay) + settings.stale_instance_timeout


@attrs.define
class _Loop:
    thread: int
    bound: float
    beaten: float
    reported: bool = False


@attrs.define
class _Wait:
    frame: FrameType
    """The waiting frame itself (held, so no later call's frame can be taken for it)."""
    since: float


class Watchdog:
    """Watches the loops of one instance (``who`` names it in the log) and every thread's
    database waits; ``answer_bound`` tells the bound of a database wait as it is now (None
    where none is bounded: SQLite)."""

    def __init__(
        self,
        who: str,
        answer_bound: Callable[[], float | None],
        *,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], Any] = os._exit,
    ) -> None:
        self.who = who
        self.answer_bound = answer_bound
        self._clock = clock
        self._exit = exit
        self._loops: dict[str, _Loop] = {}
        self._waits: dict[int, _Wait] = {}
        self._lock = threading.Lock()
        self.applies = ApplyDeadlines(who, clock)
        """The deadlines of the batches being applied (``apply-timeout``)."""
        self.exit_when_stuck = False
        """Exit with :data:`EXIT_STUCK` once a batch is stuck (the instance not live)."""

    def watch(self, name: str, bound: float) -> None:
        """Watch the calling thread's loop ``name``: it must :meth:`beat` at least every
        ``bound`` seconds (or be inside a database wait)."""
        with self._lock:
            self._loops[name] = _Loop(threading.get_ident(), bound, self._clock())

    def beat(self, name: str) -> None:
        """Loop ``name`` finished a round."""
        loop = self._loops.get(name)
        if loop is not None:
            loop.beaten = self._clock()

    def overdue(self) -> list[str]:
        """The loops that have not beaten within their bound, sorted: stuck (or in a
        database wait about to be abandoned)."""
        now = self._clock()
        with self._lock:
            loops = list(self._loops.items())
        return sorted(name for name, loop in loops if now - loop.beaten > loop.bound)

    def run(self, stop: threading.Event) -> None:
        """Look once a second until ``stop`` is set."""
        while not stop.wait(1.0):
            self.look(sys._current_frames())

    def look(self, frames: dict[int, FrameType]) -> None:
        """One look at the threads' ``frames`` (by thread id)."""
        now = self._clock()
        waiting = {}
        for thread, frame in frames.items():
            found = _database_wait(frame)
            if found is not None:
                waiting[thread] = found
        self._abandon_long_waits(waiting, now)
        self.applies.look(waiting.keys(), lambda t: _where(frames[t]) if t in frames else "?")
        if self.exit_when_stuck and (stuck := self.applies.stuck_batches()):
            log.error(
                "%s: %s; exiting with code %d so that its supervisor starts it again",
                self.who,
                stuck[0],
                EXIT_STUCK,
            )
            self._exit(EXIT_STUCK)
        with self._lock:
            loops = list(self._loops.items())
        for name, loop in loops:
            current = frames.get(loop.thread)
            if current is None or loop.thread in waiting or now - loop.beaten <= loop.bound:
                continue
            if not loop.reported:
                loop.reported = True
                log.error(
                    "%s: its %s loop made no progress for %.1f s (stuck in %s); exiting with "
                    "code %d so that its supervisor starts it again",
                    self.who,
                    name,
                    now - loop.beaten,
                    _where(current),
                    EXIT_STUCK,
                )
                self._exit(EXIT_STUCK)

    def _abandon_long_waits(self, waiting: dict[int, tuple[Any, FrameType]], now: float) -> None:
        bound = self.answer_bound()
        if bound is None:
            self._waits.clear()
            return
        for thread in set(self._waits) - set(waiting):
            del self._waits[thread]
        for thread, (connection, frame) in waiting.items():
            seen = self._waits.get(thread)
            if seen is None or seen.frame is not frame:
                self._waits[thread] = _Wait(frame, now)
                continue
            if now - seen.since > bound + GRACE:
                log.error(
                    "%s: a database wait lasted %.1f s, past the answer bound (%.1f s); "
                    "abandoning its connection (in %s)",
                    self.who,
                    now - seen.since,
                    bound,
                    _where(frame),
                )
                _abandon(connection)
                del self._waits[thread]


def _frames(frame: FrameType | None) -> Iterator[FrameType]:
    while frame is not None:
        yield frame
        frame = frame.f_back


def _database_wait(frame: FrameType) -> tuple[Any, FrameType] | None:
    """(PyMySQL connection, its waiting frame) when the thread at ``frame`` waits for the
    server; None otherwise."""
    for each in _frames(frame):
        code = each.f_code
        if code.co_name in _WAITS and code.co_filename.endswith(_DRIVER):
            connection = each.f_locals.get("self")
            if connection is not None:
                return connection, each
    return None


def _abandon(connection: Any) -> None:
    """Shut the connection's socket down: the wait on it fails at once."""
    sock = getattr(connection, "_sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):  # closed meanwhile: the wait has ended anyway
            sock.shutdown(socket.SHUT_RDWR)


def _where(frame: FrameType) -> str:
    """The innermost frames of a thread outside the standard library and installed
    packages (a statement's driver frames left out: the handler that runs it is named),
    as one short line."""
    stack = traceback.extract_stack(frame)
    own = [s for s in stack if not s.filename.startswith(_LIBRARIES)]
    return " <- ".join(
        f"{s.name} ({os.path.basename(s.filename)}:{s.lineno})" for s in (own or stack)[:-4:-1]
    )


_LIBRARIES = tuple(
    {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
)
"""Where the standard library and installed packages live."""
