"""In-memory consumers as their instance's operators see them: state, position, and
pause, resume (past a poison message) and rebuild of this process's copy alone.

Every instance runs its own copy of an in-memory consumer, so these commands reach
one process (through its admin endpoint), not the database; what each copy is doing is
published with the instance's heartbeat for the reports.
"""

from __future__ import annotations

import threading
from typing import Any

from messaging.errors import OperationError
from messaging.runtime.worker import InMemoryWorker

__all__ = ["InMemoryConsumer", "InMemoryOperationError"]

RUNNING, PAUSED, HALTED = "running", "paused", "halted"


class InMemoryOperationError(OperationError):
    """A command that does not fit the state of this instance's copy (answered 409)."""


class InMemoryConsumer(InMemoryWorker):
    """An :class:`InMemoryWorker` that operators can pause, resume and rebuild.

    A command waits for the batch in flight; the copies on other instances are untouched.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._registry = kwargs["registry"]
        self.paused = False
        self._lock = threading.Lock()

    def poll(self) -> int:
        """Apply the next batch unless paused; see :meth:`InMemoryWorker.poll`."""
        with self._lock:
            return 0 if self.paused else super().poll()

    @property
    def state(self) -> str:
        """``halted`` (at a poison message), ``paused`` or ``running``."""
        return HALTED if self.halted is not None else PAUSED if self.paused else RUNNING

    def snapshot(self) -> dict[str, Any]:
        """What the reports show: state, position (last applied), topics and handled types,
        and the poison message (with where it failed) while halted."""
        with self._lock:
            entry: dict[str, Any] = {
                "state": self.state,
                "position": self.position,
                "topics": list(self.spec.topics),
                "types": list(self.dispatcher.type_names),
            }
            if self.halted_message is not None:
                entry["halted"] = {**self.halted_message, "trace": self.trace}
            return entry

    def pause(self) -> dict[str, Any]:
        """Stop applying on this instance until resumed."""
        with self._lock:
            if self.paused:
                raise InMemoryOperationError(f"{self.spec.name} is already paused here")
            self.paused = True
            return {}

    def resume(self, *, skip_poison: bool = False) -> dict[str, Any]:
        """Run again: a halted copy retries its poison message, or with ``skip_poison``
        goes on right after it (never applied). Returns the halted message, if any."""
        with self._lock:
            halted = self.halted_message
            if skip_poison and halted is None:
                raise InMemoryOperationError(
                    f"{self.spec.name} has no halted message to skip past here"
                )
            if halted is None and not self.paused:
                raise InMemoryOperationError(f"{self.spec.name} is running here already")
            if halted is not None and skip_poison:
                self.position = int(halted["position"])
            self.paused = False
            self.halted = self.trace = self.halted_message = None
            return {"halted": [halted] if halted is not None else []}

    def rebuild(self) -> dict[str, Any]:
        """Start over: a new consumer object replays from the start of its topics (a
        paused copy stays paused)."""
        with self._lock:
            self.dispatcher = self.dispatcher_class(self.spec, self._registry, self.db)
            self.position = 0
            self.halted = self.trace = self.halted_message = None
            return {}
