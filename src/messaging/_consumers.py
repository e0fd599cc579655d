"""Consumers as declared by application classes: name, topics, partitions and handlers.

Decorators (one per consumer kind) only mark a class with its options;
:func:`consumer_spec` turns a marked class into a validated :class:`ConsumerSpec` when
the application is collected, so message classes may be defined after the consumers
that handle them.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
from sqlalchemy import Table
from sqlalchemy.schema import CreateTable

from messaging._errors import RegistrationError
from messaging._kinds import ConsumerKind
from messaging._messages import MessageRegistry
from messaging._messages import registry as default_registry
from messaging._structure import type_hints

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS_ATTRIBUTE = "__consumer_options__"
_HANDLER_ATTRIBUTE = "__handles_messages__"
PAYLOAD_READS_ATTRIBUTE = "__payload_reads__"
"""On a consumer class: stored shapes it reads beside its messages, {name: newest version}
(a consumer kind's own, as a saga's state): published with what its instance reads."""
PAYLOAD_UPCASTS_ATTRIBUTE = "__payload_upcasts__"
"""On a consumer class: a function listing the upcasters of what it reads beside its
messages (a saga's state upcasters), published with its instance's upcasters."""


DEFAULT_PARTITIONS = 16
"""How many partitions a consumer has unless its decorator says otherwise."""


@attrs.define(frozen=True, kw_only=True)
class ConsumerOptions:
    """What a decorator records on a consumer class."""

    name: str
    kind: ConsumerKind
    topics: tuple[str, ...]
    partitions: int = DEFAULT_PARTITIONS
    tables: tuple[Table, ...] = ()
    version: int = 1
    worker: Callable[..., Any] | None = None
    """The worker class that applies it (a ``ConsumerWorker`` subclass); None: its kind's."""


@attrs.define(frozen=True, kw_only=True)
class ConsumerSpec:
    """A validated consumer: its class, options and the handler method for each message type."""

    cls: type
    options: ConsumerOptions
    handlers: Mapping[type, str]
    handler_arity: Mapping[type, int]

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def kind(self) -> ConsumerKind:
        return self.options.kind

    @property
    def topics(self) -> tuple[str, ...]:
        return self.options.topics

    @property
    def partitions(self) -> int:
        return self.options.partitions

    @property
    def transactional(self) -> bool:
        """Whether effects commit with the checkpoint (see :attr:`ConsumerKind.transactional`)."""
        return self.options.kind.transactional

    def type_names(self, registry: MessageRegistry = default_registry) -> list[str]:
        """The stored type names this consumer handles, sorted."""
        return sorted(registry.type_name(cls) for cls in self.handlers)

    def stored_type_names(self, registry: MessageRegistry = default_registry) -> list[str]:
        """The stored type names of the messages it reads, sorted: those of the handled
        classes and the older names their upcasters and renames lead from."""
        names = (registry.type_name(cls) for cls in self.handlers)
        return sorted({stored for name in names for stored in registry.readers_of(name)})

    def fingerprint(
        self, registry: MessageRegistry = default_registry, tables: Sequence[Table] | None = None
    ) -> str:
        """A digest of the declaration: version, topics, handled types, partitions, table DDL
        (of ``tables``, the physical tables, when given; else of the declared ones).

        The handled types are their current names: upcasters and renames are not part of
        it, so declaring one rebuilds nothing (they change how older payloads are read, not
        what the projection is); bump ``version`` to rebuild with them."""
        from sqlalchemy.dialects import sqlite

        declaration = {
            "version": self.options.version,
            "kind": self.options.kind.value,
            "topics": sorted(self.options.topics),
            "types": self.type_names(registry),
            "partitions": self.options.partitions,
            "tables": sorted(
                str(CreateTable(t).compile(dialect=sqlite.dialect()))
                for t in (self.options.tables if tables is None else tables)
            ),
        }
        encoded = json.dumps(declaration, sort_keys=True).encode()
        return hashlib.sha256(encoded).hexdigest()[:32]


def handler(func: F) -> F:
    """Mark a method as a message handler; the type of its first argument selects the messages.

    The method is called as ``method(message)`` or ``method(message, context)``.
    """
    setattr(func, _HANDLER_ATTRIBUTE, True)
    return func


def mark_consumer(cls: type, options: ConsumerOptions) -> None:
    """Record a decorator's options on ``cls`` (validated for shape here, for handlers later)."""
    if not isinstance(cls, type):
        raise RegistrationError(f"consumer {options.name!r}: decorate a class, not {cls!r}")
    if not options.name or not isinstance(options.name, str):
        raise RegistrationError(f"{cls.__qualname__}: a consumer name must be a non-empty string")
    if "@" in options.name:
        raise RegistrationError(
            f"consumer {options.name!r}: '@' is reserved for a projection's versions "
            "(NAME@2 is version 2 of NAME); rename the consumer"
        )
    if not options.topics or any(not t or not isinstance(t, str) for t in options.topics):
        raise RegistrationError(f"consumer {options.name!r}: topics must be non-empty strings")
    if not isinstance(options.partitions, int) or not 1 <= options.partitions <= 4096:
        raise RegistrationError(
            f"consumer {options.name!r}: partitions must be an integer from 1 to 4096, "
            f"got {options.partitions!r}"
        )
    setattr(cls, _OPTIONS_ATTRIBUTE, options)


def is_consumer(obj: object) -> bool:
    """Whether ``obj`` is a class marked by one of the consumer decorators."""
    return isinstance(obj, type) and _OPTIONS_ATTRIBUTE in obj.__dict__


def consumer_spec(cls: type, registry: MessageRegistry = default_registry) -> ConsumerSpec:
    """Validate a marked class into a :class:`ConsumerSpec` (RegistrationError if it is not)."""
    options: ConsumerOptions | None = cls.__dict__.get(_OPTIONS_ATTRIBUTE)
    if options is None:
        raise RegistrationError(f"{_path(cls)} is not decorated as a consumer")
    handlers: dict[type, str] = {}
    arity: dict[type, int] = {}
    for attribute, func in _handler_functions(cls):
        message_type, params = _handled_type(cls, attribute, func)
        if not registry.is_registered(message_type):
            raise RegistrationError(
                f"consumer {options.name!r}: handler {cls.__qualname__}.{attribute} takes "
                f"{getattr(message_type, '__qualname__', message_type)!r}, "
                "which is not a registered message type (decorate it with @message(...))"
            )
        if message_type in handlers:
            raise RegistrationError(
                f"consumer {options.name!r}: {message_type.__qualname__} is handled twice, "
                f"by {handlers[message_type]} and {attribute}"
            )
        handlers[message_type] = attribute
        arity[message_type] = params
    if not handlers:
        raise RegistrationError(
            f"consumer {options.name!r} ({_path(cls)}) has no handlers; "
            "mark methods with @handler and annotate the message parameter"
        )
    return ConsumerSpec(cls=cls, options=options, handlers=handlers, handler_arity=arity)


def _handler_functions(cls: type) -> list[tuple[str, Callable[..., Any]]]:
    found = []
    for attribute in sorted(dir(cls)):
        func = inspect.getattr_static(cls, attribute, None)
        if getattr(func, _HANDLER_ATTRIBUTE, False):
            found.append((attribute, func))
    return found


def _handled_type(cls: type, attribute: str, func: Callable[..., Any]) -> tuple[Any, int]:
    where = f"handler {cls.__qualname__}.{attribute}"
    params = list(inspect.signature(func).parameters.values())[1:]  # drop self
    if not 1 <= len(params) <= 2:
        raise RegistrationError(f"{where} must take (self, message) or (self, message, context)")
    hints = type_hints(func, where)
    message_type = hints.get(params[0].name)
    if message_type is None:
        raise RegistrationError(f"{where}: annotate {params[0].name!r} with the message type")
    return message_type, len(params)


def collect_specs(
    classes: Sequence[type], registry: MessageRegistry = default_registry
) -> list[ConsumerSpec]:
    """Validate consumer classes; duplicate names are an error naming both classes."""
    specs: dict[str, ConsumerSpec] = {}
    for cls in classes:
        spec = consumer_spec(cls, registry)
        other = specs.get(spec.name)
        if other is not None and other.cls is not cls:
            raise RegistrationError(
                f"duplicate consumer name {spec.name!r}: {_path(other.cls)} and {_path(cls)}"
            )
        specs[spec.name] = spec
    return sorted(specs.values(), key=lambda s: s.name)


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
