"""Stored saga states of older shapes: read through their upcasters.

A saga's state is stored with its ``state_version`` (``@saga(state_version=)``); a state
stored at an older version is taken through the :func:`~sagas.state_upcaster` chain from
its version to the current one, then structured as the state class. The chain is checked
when the saga's dispatcher is built: a version below the current one that no upcaster
reads is one line naming the saga.

States are structured strictly, as messages are: a field the class lacks is refused,
never dropped, and so is a field it needs that is missing. A stored state that the
running code cannot read is :class:`UnreadableState`: one line naming the saga instance,
the field and the fix (a state version and its upcaster); it halts (or parks) only the
partition of that instance. A state stored at a newer version than the code's is never
read (``UnknownPayloadVersion``): its partition is left to an instance that can.
"""

from __future__ import annotations

from typing import Any

import cattrs

from messaging import DecodeError, ProjectionsError, RegistrationError, UnknownPayloadVersion
from messaging.kinds import Decode, Payload, describe, upcasting_decoder
from sagas._options import STATE_UPCASTERS, SagaOptions, state_key


class UnreadableState(ProjectionsError):
    """A saga instance's stored state does not fit the state class of the running code."""

    __module__ = "sagas"

    def __init__(self, saga: str, key: str, state_version: int, state: type, reason: str) -> None:
        super().__init__(
            f"saga {saga!r} instance {key!r}: its stored state (state version "
            f"{state_version}) cannot be read as {state.__qualname__}: {reason}; if the state "
            f"class changed, declare state_version={state_version + 1} and "
            f"@state_upcaster({saga!r}, {state_version}) turning the stored states into the "
            "new shape"
        )


def read_error(saga: str, key: str, state_version: int, state: type, error: Exception) -> Exception:
    """``error``, raised reading the stored state of instance ``key``, as it is reported: an
    :class:`UnreadableState` for a state that does not fit the class; as it is otherwise
    (a newer state version, which leaves the partition; an error of the database)."""
    if isinstance(error, UnknownPayloadVersion):
        return error
    if isinstance(error, DecodeError):
        return UnreadableState(saga, key, state_version, state, error.reason)
    if isinstance(error, (ValueError, TypeError, KeyError, cattrs.BaseValidationError)):
        return UnreadableState(saga, key, state_version, state, describe(error, "state"))
    return error


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
            raise DecodeError(describe(exc, "state"), position=position, type_name=name) from exc

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
