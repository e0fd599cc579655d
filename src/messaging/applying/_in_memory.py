"""In-memory consumers as their instance's operators see them: state, position, and
pause, resume (past a poison message) and rebuild of this process's copy alone.

Every instance runs its own copy of an in-memory consumer, so these commands reach
one process (through its admin endpoint), not the database; what each copy is doing is
published with the instance's heartbeat for the reports.
"""

from __future__ import annotations

import logging
import threading
import traceback
from typing import Any, ClassVar

from messaging._errors import OperationError, UnknownPayloadVersion
from messaging._messages import Envelope
from messaging._states import CopyState
from messaging.applying._context import HandlerContext
from messaging.applying._polling import Worker
from messaging.distribution._needs import describe
from messaging.failures._failures import last_frames
from messaging.failures._poison import Poison
from messaging.store._rows import POSITION, TYPE

log = logging.getLogger("messaging.runtime.in_memory")

__all__ = ["InMemoryConsumer", "InMemoryOperationError", "InMemoryWorker"]


class InMemoryOperationError(OperationError):
    """A command that does not fit the state of this instance's copy (answered 409)."""


class InMemoryWorker(Worker):
    """Applies an in-memory consumer whole, from the start of its topics, in this process.

    It starts with the state below (class defaults, replaced per copy as it runs)."""

    writes: ClassVar[bool] = False
    position: int = 0
    """The position of the last message applied."""
    halted: str | None = None
    """Why the copy stopped (position, type and error of the poison message), while halted."""
    trace: str | None = None
    """Where the handler failed (the last frames of its traceback), while halted."""
    halted_message: dict[str, Any] | None = None
    """The poison message's position, type and error, while halted."""
    waiting: dict[str, Any] | None = None
    """The message newer than this code's declarations it stopped before (position, type,
    version, reason): never applied, skipped or halted at; instances with a newer
    declaration apply it in their own copies."""

    @property
    def target(self) -> Any:
        """The consumer object holding the in-memory state."""
        return self.dispatcher.target

    def poll(self) -> int:
        """Apply the next batch to the in-memory state; return how many were applied."""
        if self.halted is not None or self.waiting is not None:
            return 0
        with self.db.read() as conn:
            rows = self.store.read_batch(
                conn,
                self.spec.topics,
                after=self.position,
                types=self.dispatcher.type_names,
                limit=self.settings.batch_size,
            )
        if not rows:
            return 0

        def load_envelopes() -> dict[int, Envelope]:
            with self.db.read() as conn:
                return self.store.envelopes(conn, [row[POSITION] for row in rows])

        ctx = HandlerContext(None, load_envelopes)
        for index, row in enumerate(rows):
            try:
                self.dispatcher.apply(rows[index : index + 1], ctx, self.spec.partitions)
            except Poison as poison:
                if isinstance(poison.error, UnknownPayloadVersion):
                    self._wait(poison.row[POSITION], poison.error)
                else:
                    self._halt(poison)
                return index
            self.position = row[POSITION]
        return len(rows)

    def _wait(self, position: int, error: UnknownPayloadVersion) -> None:
        reason = describe((error.type_name, error.version))
        self.waiting = {
            "position": position,
            "type": error.type_name,
            "version": error.version,
            "reason": reason,
        }
        log.warning(
            "in-memory consumer %s stops before position %d on this instance: it %s; only "
            "instances with one apply it (to their own copies)",
            self.spec.name,
            position,
            reason,
        )

    def _halt(self, poison: Poison) -> None:
        position, type_name = poison.row[POSITION], poison.row[TYPE]
        detail = "".join(traceback.format_exception_only(poison.error)).strip()
        self.halted = f"halted at position {position} ({type_name}): {detail}"
        self.trace = last_frames(poison.error)
        self.halted_message = {"position": position, "type": type_name, "error": detail}
        log.error("in-memory consumer %s %s", self.spec.name, self.halted, exc_info=poison.error)
        self.hooks.projections_message_failed(
            consumer=self.spec.name,
            partition=poison.partition,
            position=position,
            type_name=type_name,
            error=poison.error,
            instance_id=self.instance_id,
        )


class InMemoryConsumer(InMemoryWorker):
    """An :class:`InMemoryWorker` that operators can pause, resume and rebuild.

    A command waits for the batch in flight; the copies on other instances are untouched.
    """

    paused: bool = False
    """Whether an operator paused this copy."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lock = threading.Lock()
        """Held by a poll and by a command: a command waits for the batch in flight."""

    def poll(self) -> int:
        """Apply the next batch unless paused; see :meth:`InMemoryWorker.poll`."""
        with self._lock:
            return 0 if self.paused else super().poll()

    @property
    def state(self) -> str:
        """``halted`` (at a poison message), ``waiting`` (for a newer declaration),
        ``paused`` or ``running``."""
        return (
            CopyState.HALTED
            if self.halted is not None
            else CopyState.WAITING
            if self.waiting is not None
            else CopyState.PAUSED
            if self.paused
            else CopyState.RUNNING
        )

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
            if self.waiting is not None:
                entry["waiting"] = dict(self.waiting)
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
            if self.waiting is not None and (skip_poison or not self.paused):
                raise InMemoryOperationError(
                    f"{self.spec.name} waits here at position {self.waiting['position']}: it "
                    f"{self.waiting['reason']}; it is never skipped (run an instance that has "
                    "that declaration)"
                )
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
            self.dispatcher = self.dispatcher_class(self.spec, self.store.registry, self.db)
            self.position = 0
            self.halted = self.trace = self.halted_message = self.waiting = None
            return {}
