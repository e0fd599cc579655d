"""One instance: registers itself, claims partitions, runs the apply loops, stops gracefully.

Threads: one heartbeat loop, one claim loop (every ``rebalance-interval``), and one
apply loop per consumer. The first heartbeat is written synchronously at start,
before anything is fetched. A graceful stop finishes the batches in flight (for up to
``graceful-shutdown-timeout``), releases every partition and deletes the instance row.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Sequence
from types import FrameType

import pluggy

from messaging.consumers import ConsumerKind, ConsumerSpec
from messaging.database import Database
from messaging.declarations import declare
from messaging.errors import ProjectionsError
from messaging.membership import InstanceInfo, Membership
from messaging.messages import MessageRegistry
from messaging.messages import registry as default_registry
from messaging.ownership import Ownership
from messaging.retry import retry_transient
from messaging.settings import Distribution, Settings
from messaging.worker import ConsumerWorker, InMemoryWorker

log = logging.getLogger("messaging.runtime")


def default_instance_name() -> str:
    """``host:pid``, unique among the processes of one host."""
    return f"{socket.gethostname()}:{os.getpid()}"


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
        self.membership = Membership(db)
        self.ownership = Ownership(db)
        self.stop_requested = threading.Event()
        self._stop_workers = threading.Event()
        self._stop_loops = threading.Event()
        self._threads: list[threading.Thread] = []
        self.workers: dict[str, ConsumerWorker] = {}
        self.in_memory: dict[str, InMemoryWorker] = {}
        self._started = False

    def distribution(self, spec: ConsumerSpec) -> Distribution:
        """The configured distribution of a consumer."""
        group = {
            ConsumerKind.PROJECTION: self.settings.projections,
            ConsumerKind.IN_MEMORY_PROJECTION: self.settings.projections,
            ConsumerKind.ROUTE_CONSUMER: self.settings.routing,
            ConsumerKind.SAGA: self.settings.sagas,
        }[spec.kind]
        return group.distribution_for(spec.name)

    # -- start -------------------------------------------------------------------------

    def start(self) -> None:
        """Prepare the schema, declare consumers, register, claim, and start every loop."""
        if self._started:
            raise ProjectionsError("instance already started")
        self._started = True
        self.db.prepare()
        runs = {}
        for spec in self.specs:
            if spec.transactional:
                distribution = self.distribution(spec)
                declared = self._retry(
                    lambda spec=spec, d=distribution: self._declare(spec, d), f"declare {spec.name}"
                )
                runs[spec.name] = {
                    "distribution": distribution.value,
                    "fingerprint": declared,
                }
                self.workers[spec.name] = ConsumerWorker(
                    db=self.db,
                    spec=spec,
                    instance_id=self.id,
                    settings=self.consumer_settings,
                    hooks=self.hooks,
                    registry=self.registry,
                )
            else:
                self.in_memory[spec.name] = InMemoryWorker(
                    db=self.db,
                    spec=spec,
                    settings=self.consumer_settings,
                    hooks=self.hooks,
                    registry=self.registry,
                )
        info = InstanceInfo(
            id=self.id, name=self.name, host=socket.gethostname(), pid=os.getpid(), runs=runs
        )
        self._retry(
            lambda: self._in_transaction(lambda c: self.membership.register(c, info)), "register"
        )
        log.info("instance %s (%s) started with %s", self.name, self.id, sorted(runs))
        self.hooks.projections_instance_started(
            instance_id=self.id, name=self.name, consumers=[s.name for s in self.specs]
        )
        self.claim_partitions()
        self._spawn("heartbeat", self._heartbeat_loop, self._stop_loops)
        self._spawn("claims", self._claim_loop, self._stop_loops)
        for name, worker in self.workers.items():
            self._spawn(f"apply:{name}", worker.run, self._stop_workers)
        for name, memory in self.in_memory.items():
            self._spawn(f"memory:{name}", memory.run, self._stop_workers)

    def _declare(self, spec: ConsumerSpec, distribution: Distribution) -> str:
        with self.db.transaction() as conn:
            return declare(self.db, conn, spec, distribution).fingerprint

    def _in_transaction(self, action: object) -> None:
        with self.db.transaction() as conn:
            action(conn)  # type: ignore[operator]

    def _retry(self, action: object, what: str) -> object:
        return retry_transient(action, self.consumer_settings.conflict_retry, what=what)  # type: ignore[arg-type]

    def _spawn(self, name: str, target: object, stop: threading.Event) -> None:
        thread = threading.Thread(target=target, args=(stop,), name=name, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    # -- loops -------------------------------------------------------------------------

    def claim_partitions(self) -> None:
        """Claim every partition of each consumer that is unowned or owned by a dead instance."""
        live = self.membership.live_ids(self.consumer_settings.stale_instance_timeout)
        for name, worker in self.workers.items():
            with self.db.transaction() as conn:
                claims = self.ownership.claim(
                    conn, name, range(worker.spec.partitions), self.id, live
                )
                owned = self.ownership.owned(conn, name, self.id)
            known = worker.claims()
            fresh = [c for c in owned if known.get(c.partition) != c]
            fresh = [
                c for c in fresh if c.partition not in known or known[c.partition].epoch != c.epoch
            ]
            if fresh:
                worker.add_claims(fresh)
            claimed_now = {c.partition for c in claims} & {c.partition for c in fresh}
            for claim in claims:
                if claim.partition in claimed_now:
                    log.info(
                        "consumer %s: partition %d claimed by %s under epoch %d",
                        name,
                        claim.partition,
                        self.name,
                        claim.epoch,
                    )
                    self.hooks.projections_partition_claimed(
                        consumer=name,
                        partition=claim.partition,
                        epoch=claim.epoch,
                        instance_id=self.id,
                    )

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        interval = self.consumer_settings.heartbeat_interval
        while not stop.wait(interval):
            try:
                with self.db.transaction() as conn:
                    if not self.membership.heartbeat(conn, self.id):
                        log.warning("instance %s: row was removed; registering again", self.name)
                        self.membership.register(
                            conn,
                            InstanceInfo(
                                id=self.id,
                                name=self.name,
                                host=socket.gethostname(),
                                pid=os.getpid(),
                            ),
                        )
            except Exception:
                log.exception("instance %s: heartbeat failed", self.name)

    def _claim_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.consumer_settings.rebalance_interval):
            try:
                self.claim_partitions()
            except Exception:
                log.exception("instance %s: claiming partitions failed", self.name)

    # -- stop --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask the instance to stop gracefully (safe from a signal handler)."""
        self.stop_requested.set()

    def stop(self) -> None:
        """Finish batches in flight, release every partition, delete the instance row."""
        if not self._started:
            return
        self.stop_requested.set()
        self.hooks.projections_instance_stopping(instance_id=self.id, name=self.name)
        self._stop_workers.set()
        deadline = self.consumer_settings.graceful_shutdown_timeout
        workers = [t for t in self._threads if t.name.startswith(("apply:", "memory:"))]
        for thread in workers:
            thread.join(timeout=deadline)
        stuck = [t.name for t in workers if t.is_alive()]
        if stuck:
            log.warning("instance %s: %s still busy after the graceful timeout", self.name, stuck)
        self._stop_loops.set()
        for thread in self._threads:
            if thread not in workers:
                thread.join(timeout=deadline)
        with self.db.transaction() as conn:
            for name, worker in self.workers.items():
                partitions = sorted(worker.claims())
                self.ownership.release(conn, name, self.id, partitions)
            self.membership.deregister(conn, self.id)
        for name, worker in self.workers.items():
            for partition in sorted(worker.claims()):
                self.hooks.projections_partition_released(
                    consumer=name, partition=partition, instance_id=self.id
                )
        log.info("instance %s stopped", self.name)
        self._started = False

    def run(self) -> None:
        """Start, then run until SIGTERM/SIGINT (or :meth:`request_stop`), then stop gracefully."""
        previous = {}

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("instance %s: received %s, stopping", self.name, signal.Signals(signum).name)
            self.request_stop()

        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
        try:
            self.start()
            self.stop_requested.wait()
        finally:
            self.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
