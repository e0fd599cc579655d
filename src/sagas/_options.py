"""What ``@saga`` and ``@start`` record on a saga class and its handlers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from messaging._errors import RegistrationError

SAGA_ATTRIBUTE = "__saga_options__"
START_ATTRIBUTE = "__starts_saga__"


@attrs.define(frozen=True, kw_only=True)
class SagaOptions:
    """What ``@saga`` records beside the consumer options."""

    correlate_by: str
    """The attribute of every handled message that names its saga instance."""
    state: type
    """The attrs class of a saga instance's state."""


def saga_options(cls: type) -> SagaOptions:
    """The ``@saga`` options of ``cls``."""
    options: SagaOptions | None = cls.__dict__.get(SAGA_ATTRIBUTE)
    if options is None:
        raise RegistrationError(f"{cls.__qualname__} is not decorated with @saga")
    return options


def starts_saga(method: Callable[..., Any]) -> bool:
    """Whether a handler was marked with :func:`start`."""
    return bool(getattr(method, START_ATTRIBUTE, False))
