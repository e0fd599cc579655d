"""Consumer kinds: the one place where a kind of consumer plugs into the engine.

Everything that differs between kinds is declared once, in a :class:`ConsumerKind`
registered with :func:`register_kind` when the package defining the kind is imported:
its stored name, how messages name it, its settings section, the worker that applies
it, whether a new declaration rebuilds it, whether it runs transactionally (distributed
over the instances) or whole in memory on every instance, the tables it adds to the
store's schema, and the hooks it calls. The engine asks the kind; it never branches on
a kind's name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import attrs
from sqlalchemy import MetaData, Table

from messaging._errors import RegistrationError
from messaging.store._schema import register_tables


@attrs.define(frozen=True, kw_only=True)
class ConsumerKind:
    """What a kind of consumer is, declared once (see the module docstring)."""

    value: str
    """Stored in the consumers table and shown by the CLI (``"route-consumer"``)."""
    article: str
    """How a message names one of them (``"a route consumer"``)."""
    settings_group: str
    """The settings section it is configured under: a top-level key of the file, and a
    key of :attr:`Settings.consumer_groups <messaging._settings.Settings.consumer_groups>`
    (kinds may share one)."""
    no_concurrency_limit: str = ""
    """Why its consumers take no ``concurrency-limit`` (a configured one is refused with
    this reason); empty: they take one."""
    worker: Callable[..., Any] | None = None
    """The worker class that applies it (a ``ConsumerWorker`` subclass); None: the plain one."""
    transactional: bool = True
    """Effects commit with fenced checkpoints, partitions distributed over the instances;
    False: every instance runs it whole, in memory."""
    rebuildable: bool = False
    """A new declaration (or an operator) may reset it and replay its topics from the start."""
    parks: bool = False
    """``on-failure: park-source`` is supported (the parking key is the message's source:
    a stream, a route consumer's key; a saga's instance, see ``Dispatcher.parking_keys``)."""
    records_handled_ids: bool = False
    """It may keep an idempotency guard of handled message ids."""
    tables: Callable[[MetaData, str], Mapping[str, Table]] | None = None
    """Tables it adds to the store's schema, built for a table prefix."""
    rows_by_consumer: Mapping[str, str] = attrs.field(factory=dict)
    """Of the tables it adds, those holding rows of one consumer: schema attribute → the
    column naming the consumer (``{"sagas": "saga"}``); ``projections remove`` deletes a
    removed consumer's rows from them."""
    hookspecs: ModuleType | None = None
    """A module of hook specifications it calls, added to every plugin manager."""

    def __str__(self) -> str:
        return self.value


_KINDS: dict[str, ConsumerKind] = {}
_SECTION = re.compile(r"[a-z][a-z0-9]*")


def register_kind(kind: ConsumerKind) -> ConsumerKind:
    """Make ``kind`` known to the engine (again registering an equal kind changes nothing;
    another kind under a taken name is a :class:`RegistrationError`)."""
    if _SECTION.fullmatch(kind.settings_group) is None:
        raise RegistrationError(
            f"consumer kind {kind.value!r}: settings_group {kind.settings_group!r} must be a "
            "lower-case word (it is a top-level key of the settings file)"
        )
    existing = _KINDS.get(kind.value)
    if existing is not None and existing != kind:
        raise RegistrationError(f"consumer kind {kind.value!r} is registered already")
    _KINDS[kind.value] = kind
    if kind.tables is not None:
        register_tables(kind.value, kind.tables)
    return kind


def kind_named(value: str) -> ConsumerKind:
    """The registered kind stored as ``value``."""
    try:
        return _KINDS[value]
    except KeyError:
        known = ", ".join(sorted(_KINDS)) or "none"
        raise RegistrationError(f"unknown consumer kind {value!r} (registered: {known})") from None


def registered_kinds() -> list[ConsumerKind]:
    """Every registered kind, by name."""
    return [_KINDS[name] for name in sorted(_KINDS)]
