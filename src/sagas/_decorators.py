"""``@saga`` and ``@start``: declare a saga consumer, its state and its correlation key."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs
from sqlalchemy import Table

from messaging import ConsumerOptions, RegistrationError, handler, mark_consumer
from messaging.kinds import DEFAULT_PARTITIONS, PAYLOAD_READS_ATTRIBUTE, PAYLOAD_UPCASTS_ATTRIBUTE
from sagas._kind import SAGA
from sagas._options import (
    SAGA_ATTRIBUTE,
    START_ATTRIBUTE,
    STATE_UPCASTERS,
    SagaOptions,
    state_key,
)

C = TypeVar("C", bound=type)
F = TypeVar("F", bound=Callable[..., Any])


def saga(
    name: str,
    *,
    topics: str | Iterable[str],
    correlate_by: str,
    state: type,
    partitions: int = DEFAULT_PARTITIONS,
    tables: Iterable[Table] = (),
    version: int = 1,
    state_version: int = 1,
) -> Callable[[C], C]:
    """Declare a saga: a long-running process with ``state`` (an attrs class), one instance
    per value of the ``correlate_by`` attribute of the messages it handles.

    Handlers take ``(self, message, ctx)`` with a :class:`sagas.SagaContext`; those marked
    :func:`start` may begin a new instance by setting ``ctx.state``, the others act only
    on an instance that exists and has not ended. The state, the messages sent and the
    deadlines scheduled commit with the checkpoint. ``tables`` it writes with
    ``ctx.execute`` are created at start. ``state_version`` is the version of the state's
    shape, stored with it: raise it when ``state`` changes in a way stored states do not
    fit, with a :func:`state_upcaster` from the previous one.
    """
    if type(state_version) is not int or state_version < 1:
        raise RegistrationError(
            f"saga {name!r}: state_version must be an integer of at least 1, got {state_version!r}"
        )
    if not attrs.has(state):
        raise RegistrationError(f"saga {name!r}: state must be an attrs class, got {state!r}")
    if not correlate_by.isidentifier():
        raise RegistrationError(
            f"saga {name!r}: correlate_by must be an attribute name, got {correlate_by!r}"
        )
    options = ConsumerOptions(
        name=name,
        kind=SAGA,
        topics=(topics,) if isinstance(topics, str) else tuple(topics),
        partitions=partitions,
        tables=tuple(tables),
        version=version,
    )

    def decorate(cls: C) -> C:
        mark_consumer(cls, options)
        saga_options = SagaOptions(
            correlate_by=correlate_by, state=state, state_version=state_version
        )
        setattr(cls, SAGA_ATTRIBUTE, saga_options)
        # what it reads beside its messages (messaging.distribution._needs.readable)
        setattr(cls, PAYLOAD_READS_ATTRIBUTE, {state_key(name): state_version})
        setattr(cls, PAYLOAD_UPCASTS_ATTRIBUTE, lambda: state_upcasts(name))
        return cls

    return decorate


def state_upcasts(saga: str) -> list[str]:
    """The labels of the state upcasters declared for ``saga`` (when its instance starts)."""
    return [u.label for u in STATE_UPCASTERS.steps() if u.source[0] == state_key(saga)]


U = TypeVar("U", bound=Callable[[Any], Any])


def state_upcaster(saga: str, version: int) -> Callable[[U], U]:
    """Function decorator: ``function(state) -> state`` turns a stored state (a dict) of
    saga ``saga`` at ``version`` into one of ``version`` + 1 (or typed, as an
    :func:`~messaging.upcaster`). A state stored at an older version than the saga's
    ``state_version`` is read through them; the chain is checked when the saga's worker
    starts."""

    def decorate(function: U) -> U:
        STATE_UPCASTERS.add(state_key(saga), version, function, state_key(saga))
        return function

    return decorate


def start(func: F) -> F:
    """Mark a saga handler that starts a new instance when none exists for the message."""
    setattr(func, START_ATTRIBUTE, True)
    return handler(func)
