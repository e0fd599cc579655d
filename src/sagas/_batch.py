"""The saga instances one batch (of messages or deadlines) touches: read once, changed in
memory by the saga's handlers, written once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from messaging._errors import ProjectionsError
from messaging.applying._context import HandlerContext
from messaging.store._rows import check_id, is_plain_id, partition_of
from sagas._context import SagaContext
from sagas._rows import Deadline, SagaRow

if TYPE_CHECKING:
    from sagas._dispatch import SagaDispatcher


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
