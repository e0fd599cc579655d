"""Applying a saga's messages and deadlines to its instances: decoded, read once per
batch (:class:`SagaBatch`), changed in memory by the handlers, written once
(:class:`SagaDispatcher`).

A saga parks its instance (``on-failure: park-source``): the parking key of a message is
its correlation key, when that is also its source (its partition key), so the instance's
messages and deadlines share one partition; a message of another source cannot park (its
failure halts the partition) and is never held back (:meth:`SagaDispatcher.parking_keys`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from messaging import Database, HandlerContext, ProjectionsError, RegistrationError
from messaging.kinds import (
    PAYLOAD,
    PAYLOAD_VERSION,
    POSITION,
    SOURCE,
    TYPE,
    ConsumerSpec,
    Dispatcher,
    MessageRegistry,
    Poison,
    StoredRow,
    check_id,
    is_plain_id,
    is_transient,
    make_dumps,
    partition_in,
    partition_of,
    quick_decoder,
    strict_converter,
    take_write_lock,
    unreadable,
)
from sagas._context import SagaContext
from sagas._options import STATE_UPCASTERS, saga_options, starts_saga, state_key
from sagas._rows import Deadline, Due, SagaRow
from sagas._states import read_error, state_readers
from sagas._store import SagaStore


class SagaDispatcher(Dispatcher):
    """Decodes a saga's messages and deadlines, and applies them to their saga instances."""

    def __init__(self, spec: ConsumerSpec, registry: MessageRegistry, db: Database) -> None:
        super().__init__(spec, registry, db)
        self.options = saga_options(spec.cls)
        self.store = SagaStore(db, spec.name, self.options.state_version)
        self.converter = strict_converter()  # no field dropped, none coerced
        state_class = self.options.state
        self._dumps = make_dumps()
        self._unstructure_state = self.converter.get_unstructure_hook(state_class)
        self.load_state = quick_decoder(
            state_class, lambda payload, _position: self.converter.loads(payload, state_class)
        )
        """``converter.loads`` of a stored state (generated for a flat state class)."""
        self.state_readers = state_readers(spec.name, self.options, self.converter)
        """Per older stored state version, its decode function through the upcasters."""
        self.starters: set[str] = set()
        for cls, attribute in spec.handlers.items():
            where = f"saga {spec.name!r}: handler {spec.cls.__qualname__}.{attribute}"
            if spec.handler_arity[cls] != 2:
                raise RegistrationError(f"{where} must take (self, message, ctx)")
            if self.options.correlate_by not in {f.name for f in attrs.fields(cls)}:
                raise RegistrationError(
                    f"{where}: {cls.__qualname__} has no attribute "
                    f"{self.options.correlate_by!r} to correlate it by"
                )
            if starts_saga(getattr(spec.cls, attribute)):
                self.starters.add(registry.type_name(cls))
        if not self.starters:
            raise RegistrationError(
                f"saga {spec.name!r} has no @start handler: nothing can start an instance"
            )

    def encode_state(self, state: Any) -> str:
        """``state`` as stored: ``converter.dumps`` without its per-call set-up (a subclass
        of the state class unstructured as its own class)."""
        if type(state) is self.options.state:
            return self._dumps(self._unstructure_state(state))
        return self._dumps(self.converter.unstructure(state))

    def read_state(self, row: SagaRow) -> Any:
        """The state of a stored instance: upcast if stored at an older version; never
        decoded by guesswork if newer (UnknownPayloadVersion: its partition is left to an
        instance that can read it); :class:`UnreadableState` if it does not fit the class."""
        assert row.state is not None
        try:
            if row.state_version == self.options.state_version:
                return self.load_state(row.state, None)
            read = self.state_readers.get(row.state_version)
            if read is None:  # a newer one (or none a chain leads from): the reason
                key = (state_key(self.spec.name), row.state_version)
                STATE_UPCASTERS.resolve(key, {key[0]: self.options.state_version})
                raise AssertionError(key)  # pragma: no cover (it raised above)
            return read(row.state, None)
        except Exception as exc:
            failure = read_error(
                self.spec.name, row.key, row.state_version, self.options.state, exc
            )
            if failure is exc:
                raise
            raise failure from exc

    def key_of(self, message: object) -> str:
        """The saga instance a message belongs to."""
        return str(getattr(message, self.options.correlate_by))

    def parking_keys(self, rows: Sequence[StoredRow]) -> Sequence[StoredRow]:
        """``rows`` (read with their source) with the source of each replaced by None
        unless it is also the message's correlation key (or the message cannot be
        decoded): such a message is not tied to one parkable instance."""
        keyed = []
        for row in rows:
            try:
                decoders = self.handlers[row[TYPE]][0]
                key = self.key_of(decoders[row[PAYLOAD_VERSION]](row[PAYLOAD], row[POSITION]))
            except Exception:
                key = None
            keyed.append(row if key == row[SOURCE] else (*row[:SOURCE], None))
        return keyed

    def apply(self, rows: Sequence[StoredRow], ctx: HandlerContext, partition_count: int) -> None:
        """Apply ``rows`` to their saga instances and write the instances that changed."""
        row: StoredRow | None = None
        try:
            messages = []
            for row in rows:  # decoded by payload version (upcast if older)
                decoders = self.handlers[row[TYPE]][0]
                messages.append(decoders[row[PAYLOAD_VERSION]](row[PAYLOAD], row[POSITION]))
            batch = SagaBatch(self, ctx)
            batch.load(self.key_of(m) for m in messages)
            for row, message in zip(rows, messages, strict=True):
                ctx.position = row[POSITION]
                batch.handle(self.key_of(message), message, self.current[row[TYPE]])
            batch.write()
        except Exception as exc:
            if is_transient(exc) or row is None:
                raise
            exc = unreadable(self.registry, row, exc)
            raise Poison(row, partition_in(row, partition_count), exc) from exc

    def deliver(self, due: Due, ctx: HandlerContext) -> None:
        """Take the ``due`` deadlines off the table and apply them at the time they were read
        (the database's), to their saga instances as read with them."""
        deadlines = due.deadlines
        batch = SagaBatch(self, ctx, due.now)
        batch.rows.update(due.sagas)
        self.store.take(ctx.connection, deadlines)
        instances, handlers, current = batch.instances, self.handlers, self.current
        for key, name, _partition, due_at, type_name, payload, version in deadlines:
            earlier = instances.get(key)
            if earlier is not None and (name in earlier.cancelled or name in earlier.scheduled):
                continue  # cancelled or moved by a deadline delivered just before it
            decoders = handlers.get(type_name, (None, None))[0]
            if decoders is None:
                raise ProjectionsError(
                    f"saga {self.spec.name!r} has no handler for deadline {name!r} "
                    f"of type {type_name!r}"
                )
            # its due time exactly, as hex: no shortest-repr search (costly) per deadline
            ctx.cause = f"deadline\x1f{key}\x1f{name}\x1f{due_at.hex()}"
            if version >= len(decoders):  # newer than this code: the reason
                self.registry.reader(type_name, version)("", None)
            batch.handle(key, decoders[version](payload, None), current[type_name])
        batch.write()


class SagaBatch:
    """The saga instances one batch touches: read once, changed in memory, written once."""

    def __init__(
        self, dispatcher: SagaDispatcher, ctx: HandlerContext, now: float | None = None
    ) -> None:
        self.dispatcher = dispatcher
        self.ctx = ctx
        self.rows: dict[str, SagaRow] = {}
        self.instances: dict[str, SagaContext] = {}
        self.states: dict[str, str] = {}
        """Per instance handled: its state, encoded after its last message."""
        self.deadlines: dict[str, list[Deadline]] = {}
        """Per instance with deadlines scheduled: those, encoded after its last message."""
        self._now = now

    @property
    def now(self) -> float:
        """The database's time, read once per batch (unless given)."""
        if self._now is None:
            self._now = self.dispatcher.store.now(self.ctx.connection)
        return self._now

    def load(self, keys: Any) -> None:
        """Read the stored rows of ``keys``."""
        keys = set(keys)
        found = self.dispatcher.store.load(self.ctx.connection, keys)
        for key in keys:
            self.rows[key] = found.get(key) or SagaRow(
                key=key, version=None, state=None, ended=False
            )

    def handle(self, key: str, message: object, type_name: str) -> None:
        """Call the handler of ``message`` for instance ``key``, unless that instance has
        ended, or does not exist and the handler does not start one."""
        dispatcher = self.dispatcher
        instance = self.instances.get(key)
        if instance is None:
            if not is_plain_id(key):
                check_id(f"saga {dispatcher.spec.name!r}: correlation key", key)
            row = self.rows[key]
            if row.ended:
                return
            state: Any = None
            if row.state is not None:
                state = dispatcher.read_state(row)
            instance = SagaContext(self.ctx, key, state, self.now)
        if instance.ended or (instance.state is None and type_name not in dispatcher.starters):
            return
        dispatcher.handlers[type_name][1](message, instance)  # type: ignore[arg-type]
        if not isinstance(instance.state, dispatcher.options.state):
            raise ProjectionsError(
                f"saga {dispatcher.spec.name!r}: after {type_name!r} the state of {key!r} is "
                f"{instance.state!r}, not a {dispatcher.options.state.__qualname__}"
            )
        self.instances[key] = instance
        self.states[key] = dispatcher.encode_state(instance.state)
        if instance.scheduled:
            self.deadlines[key] = self._deadlines(instance)
        elif key in self.deadlines:  # none scheduled now: all cancelled again
            del self.deadlines[key]

    def _deadlines(self, instance: SagaContext) -> list[Deadline]:
        """The deadlines ``instance`` has scheduled, encoded (a bad one fails here, at the
        message that scheduled it)."""
        dispatcher = self.dispatcher
        encoded = []
        for name, (due, deadline) in instance.scheduled.items():
            check_id(f"saga {dispatcher.spec.name!r}: deadline name", name)
            if type(deadline) not in dispatcher.spec.handlers:
                raise ProjectionsError(
                    f"saga {dispatcher.spec.name!r} schedules deadline {name!r} as a "
                    f"{type(deadline).__qualname__}, which it has no handler for"
                )
            type_name, payload = dispatcher.registry.encode(deadline)
            encoded.append(
                Deadline(
                    key=instance.key,
                    name=name,
                    partition=partition_of(instance.key, dispatcher.spec.partitions),
                    due_at=due,
                    type=type_name,
                    payload=payload,
                    payload_version=dispatcher.registry.version_of(type_name),
                )
            )
        return encoded

    def write(self) -> None:
        """Store every changed instance with its deadlines (ConcurrentUpdate if one moved
        on): one statement per kind of change, whatever the number of instances."""
        store, conn, now = self.dispatcher.store, self.ctx.connection, self.now
        # SQLite: the handlers ran without the write lock; the states they read can change
        # only by this partition's owner, whose fenced checkpoint commits with them
        take_write_lock(conn)
        ended: list[str] = []
        cancelled: list[tuple[str, str]] = []
        scheduled: list[Deadline] = []
        for key, instance in self.instances.items():
            if instance.ended:
                ended.append(key)
                continue
            if instance.cancelled:
                cancelled.extend((key, name) for name in sorted(instance.cancelled))
            deadlines = self.deadlines.get(key)
            if deadlines is not None:
                scheduled.extend(deadlines)
        store.save(conn, self.states, self.rows, set(ended), now)
        if ended or cancelled:
            store.unschedule(conn, ended, cancelled)
        store.schedule(conn, scheduled, now)
