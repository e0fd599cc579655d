"""Stored saga states of older shapes: read through their upcasters.

A saga's state is stored with its ``state_version`` (``@saga(state_version=)``); a state
stored at an older version is taken through the :func:`~sagas.state_upcaster` chain from
its version to the current one, then structured as the state class. The chain is checked
when the saga's dispatcher is built: a version below the current one that no upcaster
reads is one line naming the saga.
"""

from __future__ import annotations

from typing import Any

import cattrs

from messaging._errors import DecodeError, RegistrationError
from messaging._structure import describe
from messaging._upcasting import Decode, Payload, upcasting_decoder
from sagas._options import STATE_UPCASTERS, SagaOptions, state_key


def state_readers(
    saga: str, options: SagaOptions, converter: cattrs.Converter
) -> dict[int, Decode]:
    """The decode function of each older state version of ``saga``; RegistrationError
    naming the saga when a version below the current one cannot reach it."""
    name, now = state_key(saga), options.state_version
    current = {name: now}
    for (stored, version), upcast in ((u.source, u) for u in STATE_UPCASTERS.steps()):
        if stored == name and version >= now:
            raise RegistrationError(
                f"saga {saga!r}: {upcast.label} reads state version {version}, but the saga "
                f"is at state_version={now}"
            )

    def structure(data: Payload, position: int | None) -> Any:
        try:
            return converter.structure(data, options.state)
        except (ValueError, TypeError, KeyError, cattrs.BaseValidationError) as exc:
            raise DecodeError(describe(exc), position=position, type_name=name) from exc

    readers = {}
    for version in range(1, now):
        try:
            _, steps = STATE_UPCASTERS.resolve((name, version), current)
        except DecodeError as exc:
            raise RegistrationError(
                f"saga {saga!r} is at state_version={now} but its stored state version "
                f"{version} cannot be read: {exc.reason}; declare @state_upcaster({saga!r}, "
                f"{version})"
            ) from None
        readers[version] = upcasting_decoder((name, version), steps, structure)
    return readers
