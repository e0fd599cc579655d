"""``@saga`` and ``@start``: declare a saga consumer, its state and its correlation key."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs
from sqlalchemy import Table

from messaging.consumers import ConsumerKind, ConsumerOptions, handler, mark_consumer
from messaging.errors import RegistrationError

C = TypeVar("C", bound=type)
F = TypeVar("F", bound=Callable[..., Any])

_SAGA_ATTRIBUTE = "__saga_options__"
_START_ATTRIBUTE = "__starts_saga__"


@attrs.define(frozen=True, kw_only=True)
class SagaOptions:
    """What ``@saga`` records beside the consumer options."""

    correlate_by: str
    """The attribute of every handled message that names its saga instance."""
    state: type
    """The attrs class of a saga instance's state."""


def saga(
    name: str,
    *,
    topics: str | Iterable[str],
    correlate_by: str,
    state: type,
    partitions: int = 16,
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
    from sagas.worker import SagaWorker  # the worker imports this module

    if not attrs.has(state):
        raise RegistrationError(f"saga {name!r}: state must be an attrs class, got {state!r}")
    if not correlate_by.isidentifier():
        raise RegistrationError(
            f"saga {name!r}: correlate_by must be an attribute name, got {correlate_by!r}"
        )
    options = ConsumerOptions(
        name=name,
        kind=ConsumerKind.SAGA,
        topics=(topics,) if isinstance(topics, str) else tuple(topics),
        partitions=partitions,
        tables=tuple(tables),
        version=version,
        worker=SagaWorker,
    )

    def decorate(cls: C) -> C:
        mark_consumer(cls, options)
        setattr(cls, _SAGA_ATTRIBUTE, SagaOptions(correlate_by=correlate_by, state=state))
        return cls

    return decorate


def start(func: F) -> F:
    """Mark a saga handler that starts a new instance when none exists for the message."""
    setattr(func, _START_ATTRIBUTE, True)
    return handler(func)


def saga_options(cls: type) -> SagaOptions:
    """The ``@saga`` options of ``cls``."""
    options: SagaOptions | None = cls.__dict__.get(_SAGA_ATTRIBUTE)
    if options is None:
        raise RegistrationError(f"{cls.__qualname__} is not decorated with @saga")
    return options


def starts_saga(method: Callable[..., Any]) -> bool:
    """Whether a handler was marked with :func:`start`."""
    return bool(getattr(method, _START_ATTRIBUTE, False))
