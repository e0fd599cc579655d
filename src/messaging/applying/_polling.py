"""What every worker shares: its consumer, its dispatcher, and when it polls.

A worker polls again at once after a poll that applied something. After an empty one it
waits: under an instance's pulse (:mod:`messaging.runtime._pulser`) until the pulse says
that one of its topics has new messages, or until it is given new partitions (a
worker with nothing new sends no query); without a pulse (an instance driven by hand)
for ``idle-poll-interval``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import ClassVar

import pluggy

from messaging._consumers import ConsumerSpec
from messaging._messages import MessageRegistry
from messaging._settings import ConsumerSettings
from messaging.applying._apply_timeout import Abandoned
from messaging.applying._dispatch import Dispatcher
from messaging.applying._outage import Outage
from messaging.applying._outbox import Outbox
from messaging.store._database import Database
from messaging.store._retry import is_transient
from messaging.store._store import MessageStore

log = logging.getLogger("messaging.runtime.worker")


class Worker:
    """What both workers share: the consumer, its dispatcher, and the polling loop."""

    dispatcher_class: type[Dispatcher] = Dispatcher
    """Decodes and handles a batch; kinds of consumers with more to do bring their own."""
    writes: ClassVar[bool] = True
    """Whether a poll that applied wrote to the database (an in-memory one did not)."""
    timed: ClassVar[bool] = False
    """True for a worker with work that falls due by time alone (saga deadlines): under a
    pulse it still polls every :meth:`idle_wait` too."""

    def __init__(
        self,
        *,
        db: Database,
        spec: ConsumerSpec,
        instance_id: str,
        settings: ConsumerSettings,
        hooks: pluggy.HookRelay,
        registry: MessageRegistry,
        sender: str | None = None,
        outage: Outage | None = None,
        pulsed: bool = False,
        after_first_batch: Callable[[], object] | None = None,
    ) -> None:
        self.db = db
        self.spec = spec
        self.instance_id = instance_id
        self.settings = settings
        self.hooks = hooks
        self.store = MessageStore(db, registry)
        self.outbox = Outbox(self.store, sender or spec.name)
        """Builds what handlers send (ids derived from ``sender``: a version being built
        sends as its live version would)."""
        self.dispatcher = self.dispatcher_class(spec, registry, db)
        self.outage = outage or Outage(f"consumer {spec.name}")
        """Logs an unreachable database once; the instance shares one among its workers."""
        self.after_first_batch = after_first_batch
        """Called once, after this worker's first poll that applied anything (the instance
        freezes the heap then: :mod:`messaging.runtime._heap`)."""
        self.pulsed = pulsed
        """Whether an instance's pulse wakes this worker: then an idle worker waits for
        :meth:`wake` instead of polling every ``idle-poll-interval``."""
        self.needed: frozenset[int] = frozenset()
        """The partitions whose rows record what a newer payload needs, as the last
        rebalance round read them (``messaging.distribution._needs``)."""
        self._news = threading.Event()
        self._retired = threading.Event()

    def wake(self) -> None:
        """Poll again even though the last poll found nothing: the pulse saw a topic's head
        move, the worker was given partitions, or the instance is stopping."""
        self._news.set()

    def retire(self) -> None:
        """End the apply loop after its poll in flight, without waiting for the instance's
        stop: the instance no longer runs this consumer, so nothing wakes the loop again."""
        self._retired.set()
        self.wake()

    def poll(self) -> int:
        """Apply one batch; return how many messages were applied."""
        raise NotImplementedError

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set."""
        self._loop(stop, self.poll)

    def idle_wait(self) -> float:
        """Seconds to wait after a poll that applied nothing: ``idle-poll-interval``."""
        return self.settings.idle_poll_interval

    def _loop(self, stop: threading.Event, poll: Callable[[], int]) -> None:
        """Call ``poll`` until ``stop`` is set or the worker is retired; after an empty poll
        wait for news (see the module), after a failed one ``conflict-retry.max-delay``."""
        while not (stop.is_set() or self._retired.is_set()):
            self._news.clear()  # before the poll: news arriving during it is kept
            try:
                applied = poll()
            except Abandoned:
                return  # its batch hung past its apply timeout: another thread loops now
            except Exception as exc:
                if self.outage.failed(exc):
                    pass  # an unreachable database: logged once per outage
                elif is_transient(exc):  # a lock conflict, retries spent
                    log.warning(
                        "consumer %s: poll failed, retrying after a pause: %s", self.spec.name, exc
                    )
                else:
                    log.exception(
                        "consumer %s: poll failed; retrying after a pause", self.spec.name
                    )
                stop.wait(self.settings.conflict_retry.max_delay)
                continue  # a failed poll learned nothing: poll again
            # Only a poll that applied proves the database is back: one of nothing may not
            # have reached it (no claims, or all busy in other lanes); the pulse beats soon.
            if applied:
                self.outage.succeeded(wrote=self.writes)
                settle = self.after_first_batch
                if settle is not None:
                    self.after_first_batch = None
                    settle()
            if applied == 0 and not stop.is_set():
                self._idle(stop)

    def _idle(self, stop: threading.Event) -> None:
        if not self.pulsed:
            stop.wait(self.idle_wait())
        elif self.timed:
            self._news.wait(self.idle_wait())
        else:
            # Woken by the pulse; the long timeout only guards against a pulse that died.
            self._news.wait(self.settings.stale_instance_timeout)
