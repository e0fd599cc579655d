"""What ``@saga`` and ``@start`` record on a saga class and its handlers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from messaging import RegistrationError
from messaging.kinds import UpcasterTable

SAGA_ATTRIBUTE = "__saga_options__"
START_ATTRIBUTE = "__starts_saga__"

STATE_UPCASTERS = UpcasterTable()
"""The upcasters of stored saga states, keyed by :func:`state_key`."""


def state_key(saga: str) -> str:
    """How a saga's stored state is named in :data:`STATE_UPCASTERS`, in errors and in what
    an instance publishes it reads (``runs.<saga>.reads``)."""
    return f"saga-state:{saga}"


@attrs.define(frozen=True, kw_only=True)
class SagaOptions:
    """What ``@saga`` records beside the consumer options."""

    correlate_by: str
    """The attribute of every handled message that names its saga instance."""
    state: type
    """The attrs class of a saga instance's state."""
    state_version: int = 1
    """The version of the state's shape, stored with every state (see :func:`state_upcaster`)."""


def saga_options(cls: type) -> SagaOptions:
    """The ``@saga`` options of ``cls``."""
    options: SagaOptions | None = cls.__dict__.get(SAGA_ATTRIBUTE)
    if options is None:
        raise RegistrationError(f"{cls.__qualname__} is not decorated with @saga")
    return options


def starts_saga(method: Callable[..., Any]) -> bool:
    """Whether a handler was marked with :func:`start`."""
    return bool(getattr(method, START_ATTRIBUTE, False))
