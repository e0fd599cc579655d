"""One instance: registers itself, claims partitions, runs the apply loops, stops gracefully.

Threads: one heartbeat loop, one claim loop (every ``rebalance-interval``), and one
apply loop per consumer. The first heartbeat is written synchronously at start,
before anything is fetched. A graceful stop finishes the batches in flight (for up to
``graceful-shutdown-timeout``), releases every partition and deletes the instance row.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import attrs
import pluggy

from messaging._bounds import answer_bound, lock_wait_bound
from messaging._consumers import ConsumerSpec
from messaging._errors import ProjectionsError
from messaging._lifecycle import Identity, lifecycle_event
from messaging._messages import MessageRegistry
from messaging._messages import registry as default_registry
from messaging._overrides import check_overrides
from messaging._settings import Distribution, Settings
from messaging._states import DeclarationOutcome
from messaging.applying._in_memory import InMemoryConsumer
from messaging.applying._outage import Outage
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.runtime._declared import Declared
from messaging.runtime._heap import freeze_once
from messaging.runtime._presence import Presence, Retry
from messaging.runtime._process import default_instance_name
from messaging.runtime._pulser import Pulser
from messaging.runtime._rebalancer import Rebalancer
from messaging.runtime._signals import POLL, StopSignals
from messaging.runtime._starting import StartRetry
from messaging.runtime._threads import Threads
from messaging.runtime._units import Units
from messaging.runtime._watchdog import Watchdog
from messaging.store._database import Database
from messaging.store._retry import report_retry
from messaging.versions._declarations import declare, declared_elsewhere

log = logging.getLogger("messaging.runtime.instance")

T = TypeVar("T")


class Instance:
    """A running member of the cluster for one tenant: it registers, declares its
    consumers, and runs its loops (heartbeat, pulse, rebalance rounds, one apply loop per
    consumer and per in-memory copy) until it stops.

    Its parts, each built with what it needs: :class:`Declared` (what its code declares),
    :class:`Presence` (its row: registration, heartbeats), :class:`Units` (the workers),
    :class:`Rebalancer` (the rounds), :class:`Pulser` (the pulse), :class:`Watchdog` and
    :class:`Threads`."""

    def __init__(
        self,
        db: Database,
        specs: Sequence[ConsumerSpec],
        settings: Settings,
        hooks: pluggy.HookRelay,
        *,
        name: str | None = None,
        registry: MessageRegistry = default_registry,
        instance_id: str | None = None,
    ) -> None:
        self.db = db
        name = name or default_instance_name()
        self.who = Identity(instance_id or uuid.uuid4().hex, name, hooks)
        """Its unique id (random unless given: the testing kit replays exact runs), its
        name and the plugins it tells."""
        self.declared = Declared(specs, settings, registry)
        consumer = settings.messaging.consumer
        stale = consumer.stale_instance_timeout
        db.bound_lock_waits(lock_wait_bound(stale))
        db.bound_answers(answer_bound(stale))
        self.stop_requested = threading.Event()
        self.threads = Threads()
        self.in_memory: dict[str, InMemoryConsumer] = {}
        self.watchdog = Watchdog(f"instance {name}", lambda: db.answer_timeout)
        """Ends database waits past the answer bound; exits when a loop is stuck."""
        membership = Membership(db)
        retry = Retry(consumer, self.who)
        info = InstanceInfo(id=self.who.id, name=name, host=socket.gethostname(), pid=os.getpid())
        self.presence = Presence(
            db=db,
            membership=membership,
            who=self.who,
            info=info,
            settings=consumer,
            stopping=self.stop_requested,
            in_memory=self.in_memory,
            retry=retry,
            stuck=self.watchdog.applies.stuck_batches,
        )
        round_due = threading.Event()
        self.units = Units(
            db=db,
            who=self.who,
            declared=self.declared,
            publish_runs=self.presence.publish_runs,
            retry=retry,
            cutover_due=round_due.set,  # a version being built near its end: the next step
            deadlines=self.watchdog.applies,
            outage=self.presence.outage,
        )
        """Starts and stops the workers as the consumers' rows change."""
        self.rebalancer = Rebalancer(
            db=db,
            who=self.who,
            declared=self.declared,
            membership=membership,
            units=self.units,
            retry=retry,
            watchdog=self.watchdog,
            outage=self.presence.outage,
            requested=round_due,
        )
        """Claims and releases this instance's share (the rebalance rounds)."""
        self.pulser = Pulser(
            db=db,
            who=self.who,
            settings=consumer,
            membership=membership,
            rebalancer=self.rebalancer,
            units=self.units,
            in_memory=self.in_memory,
            watchdog=self.watchdog,
            outage=self.presence.outage,
        )
        """Tells the workers and the rounds when there is something to look at."""
        self._started = False

    # -- who it is, and what it runs (read by the admin, the CLI and the testing kit) ----

    @property
    def id(self) -> str:
        """This instance's unique id (its row's key)."""
        return self.who.id

    @property
    def name(self) -> str:
        """This instance's name, as log lines and ``projections instances`` show it."""
        return self.who.name

    @property
    def hooks(self) -> pluggy.HookRelay:
        return self.who.hooks

    @property
    def specs(self) -> list[ConsumerSpec]:
        """The consumers its code declares."""
        return self.declared.specs

    @property
    def distributions(self) -> dict[str, Distribution]:
        """Each transactional consumer's distribution (from the start on)."""
        return self.declared.distributions

    @property
    def workers(self) -> dict[str, ConsumerWorker]:
        """The workers applying here, by unit name (a consumer or a version being built)."""
        return self.units.workers

    @property
    def outage(self) -> Outage:
        """The database as the loops see it (unreachable, or refusing writes)."""
        return self.presence.outage

    @property
    def heartbeat_outage(self) -> Outage:
        return self.presence.heartbeat_outage

    @property
    def registered(self) -> bool:
        return self.presence.registered

    def advertise_admin(self, url: str) -> None:
        """This instance's admin endpoints answer at ``url``: its row says so (next beat)."""
        self.presence.admin_url = url

    # -- start -------------------------------------------------------------------------

    def start(self, *, loops: bool = True, interrupted: Callable[[], bool] = lambda: False) -> None:
        """Prepare the schema, register (the first heartbeat), declare the consumers, claim,
        and start every loop, each step retried as :class:`StartRetry` says (given up at
        once when ``interrupted()``). With ``loops=False`` no thread is started: the caller
        drives :meth:`heartbeat`, :meth:`rebalance` and the workers' ``poll()`` itself (tests
        with an injected clock do). A start that fails part-way stops what it had started
        (its registration included) before the error goes on."""
        if self._started:
            raise ProjectionsError("instance already started")
        self._started = True
        reported = partial(report_retry, self.hooks, self.id)

        def stopping() -> bool:
            return interrupted() or self.stop_requested.is_set()

        step = StartRetry(self.name, self.declared.consumer_settings, reported, stopping)
        try:
            self._start(loops, step)
        except BaseException:
            try:
                self.stop()
            except Exception:
                log.exception("instance %s: could not undo its failed start", self.name)
            raise

    def _start(self, loops: bool, step: StartRetry) -> None:
        declared, settings = self.declared, self.declared.settings
        check_overrides(settings, declared.specs)
        declared.registry.check_upcasters()  # every stored version reaches a class, or one line
        # Another process may be creating a new SQLite file's schema (and WAL mode) at
        # this moment: that is a lock error like any other, and retried.
        step(self.db.prepare, "prepare the schema")
        runs = declared.fingerprint(self.db)
        self.presence.info = attrs.evolve(self.presence.info, runs=runs)
        self.presence.declares = frozenset(runs)
        if loops:  # a liveness signal its peers watch (none for an instance driven by hand)
            beat = declared.consumer_settings.idle_poll_interval
            step(partial(self.presence.hold, beat), "hold the liveness signal")
        step(self.presence.register, "register")
        self._declare(step, loops)
        log.info(
            "instance %s (%s) started with %s, in memory %s",
            self.name,
            self.id,
            sorted(runs),
            sorted(self.in_memory),
        )
        others = step(partial(declared_elsewhere, self.db, runs), "read the declared consumers")
        if others:
            log.info(
                "instance %s does not run %s: declared in the database, not by its code",
                self.name,
                ", ".join(others),
            )
        self.hooks.projections_instance_started(
            instance_id=self.id,
            name=self.name,
            consumers=[s.name for s in declared.specs],
            tenant=self.db.tenant,
        )
        step(self.rebalance, "rebalance")  # starts the workers (messaging.runtime._units)
        if settings.messaging.gc_freeze:
            freeze_once()  # what is held now is held until the stop (messaging.runtime._heap)
        self.rebalancer.announce_wait()
        if loops:
            self._loop(settings.messaging.gc_freeze)

    def _declare(self, step: StartRetry, loops: bool) -> None:
        """Declare each transactional consumer (forgetting those whose declaration the
        database finds stale) and start the in-memory copies."""
        declared = self.declared
        for spec in declared.specs:
            if not spec.transactional:
                self.in_memory[spec.name] = InMemoryConsumer(
                    db=self.db,
                    spec=spec,
                    instance_id=self.id,
                    settings=declared.settings_of(spec),
                    hooks=self.hooks,
                    registry=declared.registry,
                    outage=self.presence.outage,
                    pulsed=loops,
                )
                continue
            distribution = declared.distributions[spec.name]
            declaring = partial(declare, self.db, spec, distribution, self.id, self.name)
            if step(declaring, f"declare {spec.name}").outcome == DeclarationOutcome.STALE:
                self.presence.forget(spec.name)
                declared.forget(spec.name)
        if self.in_memory:
            step(self.presence.publish_in_memory, "publish the in-memory consumers")

    def _loop(self, gc_freeze: bool) -> None:
        """Start the loops, each in a thread of its own: watchdog, heartbeat, pulse, the
        apply loops, the rebalance rounds (after them), the in-memory copies."""
        threads = self.threads
        threads.spawn("watchdog", self.watchdog.run, self.stop_requested)
        threads.spawn("heartbeat", partial(self.presence.loop, self.watchdog), threads.heartbeat)
        self.pulser.listen()
        threads.spawn("pulse", self.pulser.loop, threads.workers)
        frozen = partial(freeze_once, "applied") if gc_freeze else None
        self.units.loop(threads.spawn_apply, frozen)  # and those that rounds start later
        threads.spawn("rebalance", self.rebalancer.loop, threads.rebalance)
        for name, memory in self.in_memory.items():
            threads.spawn(f"memory:{name}", memory.run, threads.workers)

    def retry(self, action: Callable[[], T], what: str) -> T:
        """Run ``action`` under ``conflict-retry``, telling the plugins of each retry."""
        return Retry(self.declared.consumer_settings, self.who)(action, what)

    def loops(self) -> dict[str, bool]:
        """Each thread started for a loop, by name, and whether it still runs."""
        return self.threads.alive()

    # -- loops -------------------------------------------------------------------------

    def rebalance(self) -> None:
        """One rebalance round now (see :meth:`Rebalancer.rebalance`)."""
        self.rebalancer.rebalance()

    def heartbeat(self) -> None:
        """Stamp this instance's heartbeat now (see :meth:`Presence.heartbeat`)."""
        self.presence.heartbeat()

    def operate_in_memory(
        self, name: str, command: str, *, skip_poison: bool = False
    ) -> dict[str, Any]:
        """Pause, resume or rebuild this instance's copy of in-memory consumer ``name``
        (other instances' copies are untouched), log it, and publish the new state.

        Raises :class:`KeyError` for a name this instance does not run in memory and
        :class:`~messaging.applying._in_memory.InMemoryOperationError` for a command that does not
        fit the copy's state.
        """
        worker = self.in_memory[name]
        if command == "pause":
            result = worker.pause()
        elif command == "resume":
            result = worker.resume(skip_poison=skip_poison)
        elif command == "rebuild":
            result = worker.rebuild()
        else:
            raise ValueError(f"unknown command {command!r}")
        verb = "resume --skip-poison" if skip_poison and command == "resume" else command
        lifecycle_event(verb, consumer=name, instance=self.name, scope="this instance")
        self.retry(self.presence.publish_in_memory, "publish the in-memory consumers")
        return {"consumer": name, "command": command, "instance": self.name, **result}

    # -- stop --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask the instance to stop gracefully (from another thread)."""
        self.stop_requested.set()

    def stop(self) -> None:
        """Finish batches in flight (up to ``graceful-shutdown-timeout`` in all), release
        every partition and delete the instance row. Heartbeats go on until then."""
        if not self._started:
            return
        self._started = False
        presence, threads = self.presence, self.threads
        presence.heartbeats.close()
        self.stop_requested.set()
        threads.rebalance.set()  # claim nothing more while draining
        self.rebalancer.request_round()  # wakes its loop, which sees the stop
        if presence.registered:
            self.hooks.projections_instance_stopping(instance_id=self.id, name=self.name)
            try:
                self.heartbeat()  # says "stopping": the others plan without this instance
            except Exception:
                log.exception("instance %s: could not announce its stop", self.name)
        threads.workers.set()
        self.pulser.wake()
        self.units.wake()
        for memory in self.in_memory.values():
            memory.wake()
        deadline = time.monotonic() + self.declared.consumer_settings.graceful_shutdown_timeout
        stuck = threads.join(deadline, heartbeat=False)
        if stuck:
            log.warning("instance %s: %s still busy after the graceful timeout", self.name, stuck)
        threads.heartbeat.set()
        presence.wake()
        threads.join(deadline, heartbeat=True)
        presence.let_go()  # its row says "stopping": peers do not watch it any more
        if not presence.registered:
            return
        presence.leave()
        self.units.close()
        log.info("instance %s stopped", self.name)

    def run(self) -> None:
        """Start, then run until SIGTERM/SIGINT (or :meth:`request_stop`), then stop gracefully."""
        with StopSignals() as signals:
            try:
                try:
                    self.start(interrupted=lambda: signals.received is not None)
                except Exception:
                    if signals.received is None:
                        raise
                    log.info("instance %s: received %s while starting", self.name, signals.received)
                    return
                while not self.stop_requested.wait(POLL) and signals.received is None:
                    pass
                if signals.received is not None:
                    log.info("instance %s: received %s, stopping", self.name, signals.received)
            finally:
                self.stop()
