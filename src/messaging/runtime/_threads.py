"""The threads of one instance's loops, stopped group by group: first the rebalance loop
(claim nothing more), then the apply loops and the pulse (finish the batches in flight),
the heartbeat last (the peers hear from the instance until it has let go)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Loop = Callable[[threading.Event], None]
"""A loop's body: runs until the event it is given is set."""


class Threads:
    """Starts an instance's loops in threads of their own and ends them in order."""

    def __init__(self) -> None:
        self.rebalance = threading.Event()
        """Set to end the rebalance loop."""
        self.workers = threading.Event()
        """Set to end the apply loops, the pulse and the in-memory copies."""
        self.heartbeat = threading.Event()
        """Set to end the heartbeat loop (the last one)."""
        self._threads: list[threading.Thread] = []

    def spawn(self, name: str, loop: Loop, stop: threading.Event) -> None:
        """Run ``loop`` in a daemon thread called ``name`` until ``stop`` is set."""
        thread = threading.Thread(target=loop, args=(stop,), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def spawn_apply(self, name: str, loop: Loop) -> None:
        """Run the apply loop ``loop`` in a thread of its own until the workers stop."""
        self.spawn(name, loop, self.workers)

    def alive(self) -> dict[str, bool]:
        """Each thread started for a loop, by name, and whether it still runs."""
        return {thread.name: thread.is_alive() for thread in self._threads}

    def join(self, deadline: float, *, heartbeat: bool) -> list[str]:
        """Wait until the loops end (the heartbeat's too, with ``heartbeat``), at most until
        ``deadline`` (monotonic); return the names of those still running."""
        joined = [t for t in self._threads if heartbeat or t.name != "heartbeat"]
        for thread in joined:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return [t.name for t in joined if t.is_alive()]
