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
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import attrs
import pluggy
from sqlalchemy import Connection

from messaging._consumers import ConsumerSpec
from messaging._errors import ProjectionsError
from messaging._lifecycle import Identity, lifecycle_event, partition_event
from messaging._messages import MessageRegistry
from messaging._messages import registry as default_registry
from messaging._overrides import check_overrides
from messaging._settings import ConsumerGroupSettings, Distribution, Settings
from messaging._states import DeclarationOutcome
from messaging.applying._in_memory import InMemoryConsumer
from messaging.applying._outage import Heartbeats, Outage, run_every
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._membership import InstanceInfo, Membership
from messaging.distribution._needs import published
from messaging.distribution._ownership import Ownership
from messaging.distribution._pulse import bump_generation
from messaging.runtime._heap import freeze_once
from messaging.runtime._process import default_instance_name, process_exists
from messaging.runtime._pulser import Pulser
from messaging.runtime._rebalancer import Rebalancer
from messaging.runtime._signals import POLL, StopSignals
from messaging.runtime._starting import StartRetry
from messaging.runtime._units import Units
from messaging.runtime._watchdog import Watchdog, round_bound
from messaging.store._database import Database, answer_bound, lock_wait_bound
from messaging.store._retry import report_retry, retry_transient
from messaging.store._store import MessageStore
from messaging.versions._declarations import declare, declared_elsewhere, tenant_fingerprint

log = logging.getLogger("messaging.runtime.instance")

T = TypeVar("T")


class Instance:
    """A running member of the cluster for one tenant."""

    def __init__(
        self,
        db: Database,
        specs: Sequence[ConsumerSpec],
        settings: Settings,
        hooks: pluggy.HookRelay,
        *,
        name: str | None = None,
        registry: MessageRegistry = default_registry,
    ) -> None:
        self.db = db
        self.specs = list(specs)
        self.settings = settings
        self.consumer_settings = settings.messaging.consumer
        self.hooks = hooks
        self.registry = registry
        self.id = uuid.uuid4().hex
        self.name = name or default_instance_name()
        self.who = Identity(self.id, self.name, hooks)
        stale = self.consumer_settings.stale_instance_timeout
        db.bound_lock_waits(lock_wait_bound(stale))
        db.bound_answers(answer_bound(stale))
        self.membership = Membership(db)
        self.ownership = Ownership(db)
        self.store = MessageStore(db, registry)
        self.stop_requested = threading.Event()
        self._stop_workers = threading.Event()
        self._stop_rebalance = threading.Event()
        self._stop_heartbeat = threading.Event()
        self._beat_soon = threading.Event()
        """Set when a database session opens: the heartbeat records it at once."""
        self.fingerprints: dict[str, str] = {}
        self.info = InstanceInfo(
            id=self.id, name=self.name, host=socket.gethostname(), pid=os.getpid()
        )
        self.registered = False
        self.limiter = threading.BoundedSemaphore(self.consumer_settings.executor.max_workers)
        """Bounds the batches applied at once across every consumer of the instance."""
        self._threads: list[threading.Thread] = []
        self.workers: dict[str, ConsumerWorker] = {}
        self.in_memory: dict[str, InMemoryConsumer] = {}
        self._started = False
        self.distributions: dict[str, Distribution] = {}
        self.heartbeats = Heartbeats(self.name, stale, db.engine)
        self.outage = Outage(f"instance {self.name}", self.heartbeats)
        """The database as the workers and the rebalance loop see it: logged on its edges."""
        self.heartbeat_outage = Outage(f"instance {self.name} heartbeat", self.heartbeats)
        self.units = Units(self)
        """Starts and stops the workers as the consumers' rows change."""
        self.rebalancer = Rebalancer(self)
        """Claims and releases this instance's share (the rebalance rounds)."""
        self.pulser = Pulser(self)
        """Tells the workers and the rounds when there is something to look at."""
        self.admin_url: str | None = None
        """Where this instance's admin endpoints answer, if it serves them (published)."""
        self.watchdog = Watchdog(f"instance {self.name}", lambda: db.answer_timeout)
        """Ends database waits past the answer bound; exits when a loop is stuck."""
        self.loop_bound = partial(round_bound, self.consumer_settings, db=db)
        """Seconds a round of a loop run every so many seconds may take (its watchdog bound)."""

    def group(self, spec: ConsumerSpec) -> ConsumerGroupSettings:
        return self.settings.group(spec.kind.settings_group)

    def distribution(self, spec: ConsumerSpec) -> Distribution:
        """The configured distribution of a consumer."""
        return self.group(spec).distribution_for(spec.name)

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

        step = StartRetry(self.name, self.consumer_settings, reported, stopping)
        try:
            self._start(loops, step)
        except BaseException:
            try:
                self.stop()
            except Exception:
                log.exception("instance %s: could not undo its failed start", self.name)
            raise

    def _start(self, loops: bool, step: StartRetry) -> None:
        check_overrides(self.settings, self.specs)
        self.registry.check_upcasters()  # every stored version reaches a class, or one line
        # Another process may be creating a new SQLite file's schema (and WAL mode) at
        # this moment: that is a lock error like any other, and retried.
        step(self.db.prepare, "prepare the schema")
        runs = {}
        for spec in self.specs:
            if spec.transactional:
                distribution = self.distributions[spec.name] = self.distribution(spec)
                self.fingerprints[spec.name] = tenant_fingerprint(self.db, spec, self.registry)
                runs[spec.name] = {
                    "distribution": distribution.value,
                    "fingerprint": self.fingerprints[spec.name],
                    **published(self.registry, spec),  # (messaging.distribution._needs)
                }
        self.info = attrs.evolve(self.info, id=self.id, name=self.name, runs=runs)
        if loops:  # a liveness signal its peers watch (none for an instance driven by hand)
            hold = partial(self.membership.hold, self.id, self.consumer_settings.idle_poll_interval)
            step(hold, "hold the liveness signal")
        step(self._register, "register")
        self.registered = True
        for spec in self.specs:
            if not spec.transactional:
                self.in_memory[spec.name] = InMemoryConsumer(
                    db=self.db,
                    spec=spec,
                    instance_id=self.id,
                    settings=self.group(spec).consumer_settings_for(
                        spec.name, self.consumer_settings
                    ),
                    hooks=self.hooks,
                    registry=self.registry,
                )
                continue
            distribution = self.distributions[spec.name]
            declaring = partial(declare, self.db, spec, distribution, self.id, self.name)
            if step(declaring, f"declare {spec.name}").outcome == DeclarationOutcome.STALE:
                self.forget(spec.name)
                del self.fingerprints[spec.name]
        for memory in self.in_memory.values():
            memory.outage = self.outage
        if self.in_memory:
            step(self.publish_in_memory, "publish the in-memory consumers")
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
            consumers=[s.name for s in self.specs],
            tenant=self.db.tenant,
        )
        step(self.rebalance, "rebalance")  # starts the workers (messaging.runtime._units)
        if self.settings.messaging.gc_freeze:
            freeze_once()  # what is held now is held until the stop (messaging.runtime._heap)
            for worker in self.workers.values():
                worker.after_first_batch = partial(freeze_once, "applied")
        self.rebalancer.announce_wait()
        if not loops:
            return
        self._spawn("watchdog", self.watchdog.run, self.stop_requested)
        self._spawn("heartbeat", self._heartbeat_loop, self._stop_heartbeat)
        for looped in [*self.workers.values(), *self.in_memory.values()]:
            looped.pulsed = True
        self.pulser.listen()
        self._spawn("pulse", self.pulser.loop, self._stop_workers)
        for name, worker in self.workers.items():
            self.spawn(f"apply:{name}", worker.run)
        self.units.looping = True  # from now on a worker started by a round gets a thread
        self._spawn("rebalance", self.rebalancer.loop, self._stop_rebalance)  # (after them)
        for name, memory in self.in_memory.items():
            self._spawn(f"memory:{name}", memory.run, self._stop_workers)

    def _register(self) -> None:
        """Insert this instance's row, refusing a name a live instance already has. A holder
        of the name on this host whose process is gone (a restarted worker's predecessor,
        killed with SIGKILL) is not waited for: its row is removed, live or stale."""
        timeout = self.consumer_settings.stale_instance_timeout
        with self.db.transaction() as conn:
            for other in self.membership.instances(conn, timeout):
                if other.id == self.id:
                    return  # an earlier attempt committed unacknowledged: registered already
                if other.name != self.name:
                    continue
                if other.host == self.info.host and not process_exists(other.pid):
                    log.info(
                        "instance %s: its previous holder (pid %d) is gone; taking over",
                        self.name,
                        other.pid,
                    )
                    self.membership.deregister(conn, other.id)
                    continue
                if not other.live:
                    continue
                raise ProjectionsError(
                    f"instance name {self.name!r} is taken by a live instance "
                    f"(pid {other.pid} on {other.host}); choose another with --instance-name"
                )
            self.membership.register(conn, self.info)
            bump_generation(self.db, conn)

    def retry(self, action: Callable[[], T], what: str) -> T:
        return retry_transient(
            action,
            self.consumer_settings.conflict_retry,
            what=what,
            on_retry=partial(report_retry, self.hooks, self.id, what),
        )

    def loops(self) -> dict[str, bool]:
        """Each thread started for a loop, by name, and whether it still runs."""
        return {thread.name: thread.is_alive() for thread in self._threads}

    def _spawn(self, name: str, target: object, stop: threading.Event) -> None:
        thread = threading.Thread(target=target, args=(stop,), name=name, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def spawn(self, name: str, target: object) -> None:
        """Run the apply loop ``target`` in a thread of its own until the workers stop."""
        self._spawn(name, target, self._stop_workers)

    # -- loops -------------------------------------------------------------------------

    def forget(self, name: str) -> None:
        """Stop telling the peers that this instance runs ``name``: it applies nothing of
        it, so nobody may plan partitions of it here."""
        self.publish_runs({c: run for c, run in self.info.runs.items() if c != name})

    def publish_runs(self, runs: Mapping[str, Mapping[str, Any]]) -> None:
        """Tell the peers which consumers (by name) this instance runs, and how."""
        self.info = attrs.evolve(self.info, runs=runs)

        def update() -> None:
            with self.db.transaction() as conn:
                self.membership.update_runs(conn, self.id, runs)

        self.retry(update, "publish what it runs")

    def rebalance(self) -> None:
        """One rebalance round now (see :meth:`Rebalancer.rebalance`)."""
        self.rebalancer.rebalance()

    def heartbeat(self) -> None:
        """Stamp this instance's heartbeat (and whether it is stopping); register again if
        its row was removed, and tell the peers if it had turned stale or been declared
        gone; now and then, remove rows of instances long dead."""
        started = time.perf_counter()
        stale = self.consumer_settings.stale_instance_timeout
        with self.db.transaction() as conn:
            stopping = self.stop_requested.is_set()
            sent = time.monotonic()  # no later than the time the row records
            beat = self.membership.heartbeat(conn, self.id, stale, stopping=stopping)
            if beat != "live":
                log.warning("instance %s: its row was %s; live again", self.name, beat)
            if beat == "removed":
                self.membership.register(conn, self.info)
            if self.in_memory:
                self._publish_in_memory(conn)
            if stopping or beat != "live":  # the others plan without (or with) this instance
                bump_generation(self.db, conn)
        self.heartbeats.beat(sent)
        self.hooks.projections_heartbeat(instance_id=self.id, seconds=time.perf_counter() - started)
        self.membership.remove_stale_when_due(stale)

    def publish_in_memory(self) -> None:
        """Write what this instance's in-memory consumers are doing to its row now (the
        heartbeat does it too), for ``status`` and the admin endpoints of every instance."""
        with self.db.transaction() as conn:
            self._publish_in_memory(conn)

    def _publish_in_memory(self, conn: Connection) -> None:
        consumers = {name: worker.snapshot() for name, worker in self.in_memory.items()}
        published = {"admin": self.admin_url, "consumers": consumers}
        self.membership.publish_in_memory(conn, self.id, published)

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
        self.retry(self.publish_in_memory, "publish the in-memory consumers")
        return {"consumer": name, "command": command, "instance": self.name, **result}

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        heartbeat = partial(self.retry, self.heartbeat, "heartbeat")
        interval = self.consumer_settings.heartbeat_interval
        self.watchdog.watch("heartbeat", self.loop_bound(interval))
        beat, what = partial(self.watchdog.beat, "heartbeat"), f"instance {self.name}: heartbeat"
        if self.db.sessions is not None:
            self.db.sessions.on_open(self._beat_soon)
        soon = self._beat_soon
        run_every(interval, heartbeat, what, stop, self.heartbeat_outage, beat=beat, soon=soon)

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
        self.heartbeats.close()
        self.stop_requested.set()
        self._stop_rebalance.set()  # claim nothing more while draining
        self.rebalancer.request_round()  # wakes its loop, which sees the stop
        if self.registered:
            self.hooks.projections_instance_stopping(instance_id=self.id, name=self.name)
            try:
                self.heartbeat()  # says "stopping": the others plan without this instance
            except Exception:
                log.exception("instance %s: could not announce its stop", self.name)
        self._stop_workers.set()
        self.pulser.wake()
        for worker in [*self.workers.values(), *self.in_memory.values()]:
            worker.wake()
        deadline = time.monotonic() + self.consumer_settings.graceful_shutdown_timeout
        for thread in self._threads:
            if thread.name != "heartbeat":
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive() and t.name != "heartbeat"]
        if stuck:
            log.warning("instance %s: %s still busy after the graceful timeout", self.name, stuck)
        self._stop_heartbeat.set()
        self._beat_soon.set()
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.membership.let_go()  # its row says "stopping": peers do not watch it any more
        if not self.registered:
            return

        released: dict[tuple[str, int], None] = {}
        """What any attempt released: retried after an unacknowledged commit that went
        through, the release finds nothing left, yet those partitions were let go."""

        def leave() -> None:
            with self.db.transaction() as conn:
                released.update(dict.fromkeys(self.ownership.release_all(conn, self.id)))
                self.membership.deregister(conn, self.id)
                bump_generation(self.db, conn)

        self.retry(leave, "release and deregister")
        self.units.close()
        for consumer, partition in released:
            partition_event(self.who, consumer, partition, None)
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
