"""``@saga`` and ``@start``: declare a saga consumer, its state and its correlation key."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs
from sqlalchemy import Table

from messaging._consumers import DEFAULT_PARTITIONS, ConsumerOptions, handler, mark_consumer
from messaging._errors import RegistrationError
from sagas._kind import SAGA
from sagas._options import SAGA_ATTRIBUTE, START_ATTRIBUTE, SagaOptions

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
) -> Callable[[C], C]:
    """Declare a saga: a long-running process with ``state`` (an attrs class), one instance
    per value of the ``correlate_by`` attribute of the messages it handles.

    Handlers take ``(self, message, ctx)`` with a :class:`sagas.SagaContext`; those marked
    :func:`start` may begin a new instance by setting ``ctx.state``, the others act only
    on an instance that exists and has not ended. The state, the messages sent and the
    deadlines scheduled commit with the checkpoint. ``tables`` it writes with
    ``ctx.execute`` are created at start.
    """
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
        setattr(cls, SAGA_ATTRIBUTE, SagaOptions(correlate_by=correlate_by, state=state))
        return cls

    return decorate


def start(func: F) -> F:
    """Mark a saga handler that starts a new instance when none exists for the message."""
    setattr(func, START_ATTRIBUTE, True)
    return handler(func)
