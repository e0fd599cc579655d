"""A supervisor of N instance processes: spawned (never forked with open connections),
restarted with backoff when they die, stopped gracefully on SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from messaging.runtime._signals import POLL, StopSignals

log = logging.getLogger("messaging.runtime.supervisor")

RESTART_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits before successive restarts of a worker that keeps dying."""
HEALTHY_AFTER = 60.0
"""A worker that ran this long without dying is restarted without delay next time."""


class Supervisor:
    """Runs ``count`` worker processes, each started with ``command(index)``."""

    def __init__(
        self,
        command: Callable[[int], Sequence[str]],
        count: int,
        *,
        stop_timeout: float = 60.0,
        poll_interval: float = 0.2,
    ) -> None:
        if count < 1:
            raise ValueError("a supervisor needs at least one worker")
        self.command = command
        self.count = count
        self.stop_timeout = stop_timeout
        self.poll_interval = poll_interval
        self.stopping = threading.Event()
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._started_at: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._restart_at: dict[int, float] = {}
        self.restarts = 0

    def _start(self, index: int) -> None:
        process = subprocess.Popen(list(self.command(index)))
        self.processes[index] = process
        self._started_at[index] = time.monotonic()
        log.info("worker %d started (pid %d)", index, process.pid)
        if self.stopping.is_set():
            # A stop signal came while this worker was being spawned, before _forward could
            # see it: pass the stop on, or it would run on until killed at stop_timeout.
            process.send_signal(signal.SIGTERM)

    def _forward(self, name: str) -> None:
        """Pass the stop signal ``name`` on to every worker still running."""
        log.info("supervisor: %s received, stopping workers", name)
        self.stopping.set()
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.Signals[name])

    def run(self) -> int:
        """Run until a stop signal; return 0 when every worker then stopped cleanly."""
        with StopSignals() as signals:
            for index in range(1, self.count + 1):
                self._start(index)
            waited = 0.0
            while signals.received is None and not self.stopping.wait(POLL):
                waited += POLL
                if waited >= self.poll_interval:
                    waited = 0.0
                    self._restart_dead()
            self._forward(signals.received or "SIGTERM")
            return self._wait_all()

    def _restart_dead(self) -> None:
        now = time.monotonic()
        for index, process in list(self.processes.items()):
            code = process.poll()
            if code is None:
                continue
            if index not in self._restart_at:
                ran = now - self._started_at[index]
                failures = 0 if ran >= HEALTHY_AFTER else self._failures.get(index, 0) + 1
                self._failures[index] = failures
                delay = RESTART_BACKOFF[min(max(failures - 1, 0), len(RESTART_BACKOFF) - 1)]
                self._restart_at[index] = now + delay
                log.warning(
                    "worker %d (pid %d) exited with %s; restarting in %.1fs",
                    index,
                    process.pid,
                    code,
                    delay,
                )
            if now >= self._restart_at[index] and not self.stopping.is_set():
                del self._restart_at[index]
                self.restarts += 1
                self._start(index)

    def _wait_all(self) -> int:
        deadline = time.monotonic() + self.stop_timeout
        codes = []
        for index, process in self.processes.items():
            try:
                codes.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                log.error("worker %d did not stop in time; killing it", index)
                process.kill()
                codes.append(process.wait())
        failed = [c for c in codes if c not in (0, -signal.SIGTERM, -signal.SIGINT)]
        return 0 if not failed else 1
