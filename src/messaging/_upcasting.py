"""Upcasters: the ways from every stored (type, version) of a payload to a current class.

An upcaster turns the stored payload (a dict) of (type, version n) into the payload of
(type', version n + 1); a typed one takes an attrs class of the old shape and may return
an attrs instance of the next one. A rename maps an old type name to a new one at the
same version.
Following them from a stored (type, version) leads, step by step, to a registered class
at its current version: the chain. :meth:`UpcasterTable.check` validates every chain at
start-up (gaps, duplicates, cycles, classes their older versions cannot reach);
:meth:`UpcasterTable.resolve` walks one. Only payloads older than their class's version
take this way: current ones keep their generated decoders (``messaging._messages``).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from messaging._errors import DecodeError, RegistrationError, UnknownPayloadVersion
from messaging._structure import strict_converter, type_hints

Payload = dict[str, Any]
"""A stored payload as an upcaster sees it: the decoded JSON object."""
Key = tuple[str, int]
"""A stored (type name, payload version)."""


@attrs.frozen
class Upcast:
    """One step of a chain: an upcaster (``function``) or a rename (``function`` None)."""

    source: Key
    target: Key
    function: Callable[[Payload], Any] | None = None

    @property
    def label(self) -> str:
        """How errors and reports name the step."""
        (old, version), (new, target) = self.source, self.target
        if self.function is None:
            return f"rename {old!r} -> {new!r}"
        return f"upcaster {_path(self.function)} ({old!r} v{version} -> {new!r} v{target})"

    def apply(self, data: Payload, *, position: int | None, stored: str) -> Payload:
        """The payload after this step; DecodeError naming the step if it fails or
        returns something other than a JSON object."""
        if self.function is None:
            return data
        try:
            result: object = self.function(data)  # user code: whatever it returns is checked
        except Exception as exc:
            reason = f"{self.label} failed: {type(exc).__name__}: {exc}"
            raise DecodeError(reason, position=position, type_name=stored) from exc
        if isinstance(result, dict):
            return result
        if attrs.has(type(result)):  # a typed upcaster's instance of the next shape
            unstructured: object = _CONVERTER.unstructure(result)
            if isinstance(unstructured, dict):
                return unstructured
        reason = f"{self.label} returned {type(result).__name__}, not a dict or attrs instance"
        raise DecodeError(reason, position=position, type_name=stored)


class UpcasterTable:
    """The upcasters and renames declared for one message registry."""

    def __init__(self) -> None:
        self._upcasts: dict[Key, Upcast] = {}
        self._renames: dict[str, str] = {}

    def add(self, type_name: str, version: int, function: Callable[[Any], Any], to: str) -> None:
        """Declare ``function`` from (``type_name``, ``version``) to (``to``, ``version`` + 1):
        on dicts, or typed (:func:`typed`); a redefinition of the same function path
        replaces it."""
        _check_name("an upcaster's type name", type_name)
        _check_name("an upcaster's target type name", to)
        if type(version) is not int or version < 1:
            raise RegistrationError(
                f"upcaster of message type {type_name!r}: the version it reads must be an "
                f"integer of at least 1, got {version!r}"
            )
        if not callable(function):
            raise RegistrationError(f"upcaster of message type {type_name!r}: not a function")
        function = typed(function, f"upcaster {_path(function)}")
        key = (type_name, version)
        existing = self._upcasts.get(key)
        if existing is not None and _path(existing.function) != _path(function):
            raise RegistrationError(
                f"message type {type_name!r} version {version} has two upcasters: "
                f"{_path(existing.function)} and {_path(function)}"
            )
        self._upcasts[key] = Upcast(key, (to, version + 1), function)

    def add_rename(self, old: str, new: str) -> None:
        """Declare that stored payloads of type ``old`` are payloads of ``new``."""
        _check_name("a renamed type name", old)
        _check_name("a rename's new type name", new)
        if old == new:
            raise RegistrationError(f"rename of message type {old!r}: to itself")
        existing = self._renames.get(old)
        if existing is not None and existing != new:
            raise RegistrationError(
                f"message type {old!r} is renamed twice: to {existing!r} and to {new!r}"
            )
        self._renames[old] = new

    def step(self, key: Key) -> Upcast | None:
        """The step from ``key``: its upcaster, else its type's rename, else None."""
        upcast = self._upcasts.get(key)
        if upcast is not None:
            return upcast
        new = self._renames.get(key[0])
        return None if new is None else Upcast(key, (new, key[1]))

    def steps(self) -> list[Upcast]:
        """Every declared upcaster (and rename, at version 1), for reports."""
        renames = [Upcast((old, 1), (new, 1)) for old, new in self._renames.items()]
        return sorted([*self._upcasts.values(), *renames], key=lambda u: u.source)

    def resolve(
        self, key: Key, current: Mapping[str, int], *, position: int | None = None
    ) -> tuple[Key, list[Upcast]]:
        """The current (type, version) ``key`` leads to and the steps on the way.

        UnknownPayloadVersion when ``key`` is newer than everything declared for its type
        (a newer instance wrote it); DecodeError for a stored key no chain leads from (a
        gap), or a chain going round in a cycle."""
        steps: list[Upcast] = []
        seen = [key]
        while True:
            name, version = key
            now = current.get(name)
            if now is not None and version == now:
                return key, steps
            step = None if now is not None and version > now else self.step(key)
            if step is None:
                newest = self._newest(name, current)
                if newest == 0:
                    raise DecodeError("unknown message type", position=position, type_name=name)
                if version > newest:
                    raise UnknownPayloadVersion(name, version, position=position)
                reason = f"no upcaster from version {version} of {name!r}"
                raise DecodeError(reason, position=position, type_name=seen[0][0])
            key = step.target
            steps.append(step)
            if key in seen:
                cycle = " -> ".join(f"{n} v{v}" for n, v in [*seen, key])
                raise DecodeError(f"a cycle: {cycle}", position=position, type_name=seen[0][0])
            seen.append(key)

    def sources(self, current: Mapping[str, int]) -> Iterator[Key]:
        """Every (type, version) a chain can start from: the versions of the current classes
        and of the types upcasters and renames read."""
        newest = max([*current.values(), *(v + 1 for _, v in self._upcasts)], default=1)
        names = {*current, *(name for name, _ in self._upcasts), *self._renames}
        for name in sorted(names):
            for version in range(1, newest + 1):
                yield name, version

    def check(self, current: Mapping[str, int]) -> None:
        """Refuse, with one line naming the type, a declaration some stored payload could
        not be read through: an upcaster or rename leading nowhere or round in a cycle, an
        upcaster from a class's current version or later, a gap in a class's versions."""
        for (name, version), upcast in sorted(self._upcasts.items()):
            now = current.get(name)
            if now is not None and version >= now:
                raise RegistrationError(
                    f"{upcast.label} reads version {version} of {name!r}, but its class is "
                    f"at version {now}: declare @message({name!r}, version={version + 1})"
                )
            self._check_reaches((name, version), upcast.label, current)
        for old, new in sorted(self._renames.items()):
            what = f"rename {old!r} -> {new!r}"
            if old in current:
                raise RegistrationError(f"{what}: {old!r} is the name of a current class")
            names = [old]
            while names[-1] in self._renames:
                names.append(self._renames[names[-1]])
                if names[-1] in names[:-1]:
                    raise RegistrationError(f"{what}: renames go round: {' -> '.join(names)}")
            self._check_reaches((old, self._newest(names[-1], current)), what, current)
        entries: dict[str, int] = {}
        for upcast in self._upcasts.values():
            target, version = upcast.target
            if target != upcast.source[0]:
                entries[target] = min(version, entries.get(target, version))
        for new in self._renames.values():  # its older versions are stored under the old name
            entries[new] = current.get(new, 1)
        for name, now in sorted(current.items()):
            for version in range(entries.get(name, 1), now):
                if self.step((name, version)) is None:
                    raise RegistrationError(
                        f"message type {name!r} is at version {now} but no upcaster reads "
                        f"its version {version}: declare @upcaster({name!r}, {version})"
                    )

    def _check_reaches(self, key: Key, what: str, current: Mapping[str, int]) -> None:
        """RegistrationError unless ``key`` leads to a current class."""
        try:
            self.resolve(key, current)
        except DecodeError as exc:
            reason = exc.reason
            if isinstance(exc, UnknownPayloadVersion) or reason == "unknown message type":
                reason = (
                    f"it leads to {exc.type_name!r}, which is no current class and no "
                    "upcaster or rename leads on from"
                )
            raise RegistrationError(f"{what}: {reason}") from None

    def _newest(self, name: str, current: Mapping[str, int]) -> int:
        """The newest version of ``name`` anything declared knows (0: none)."""
        known = [v for n, v in self._upcasts if n == name]
        if name in current:
            known.append(current[name])
        new = self._renames.get(name)
        if new is not None:
            known.append(current.get(new, 0))
        return max(known, default=0)


def typed(function: Callable[[Any], Any], what: str) -> Callable[[Payload], Any]:
    """``function`` as a step on stored payloads: one whose parameter is annotated with an
    attrs class (the old shape) gets the payload structured into it first (by cattrs; a
    payload that does not fit fails as the upcaster). Others get the dict as stored."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: given the dict
        return function
    if len(parameters) != 1:
        raise RegistrationError(f"{what} must take one argument: the stored payload")
    shape = type_hints(function, what).get(parameters[0].name)
    if not (isinstance(shape, type) and attrs.has(shape)):
        return function

    @functools.wraps(function)
    def step(payload: Payload) -> Any:
        return function(_CONVERTER.structure(payload, shape))

    return step


_CONVERTER = strict_converter()
"""Structures payloads into typed upcasters' old shapes (exact types, no extra keys: as
messages are) and unstructures what they return."""


def _check_name(what: str, value: object) -> None:
    if not value or not isinstance(value, str):
        raise RegistrationError(f"{what} must be a non-empty string, got {value!r}")


def _path(function: object) -> str:
    module = getattr(function, "__module__", None) or "?"
    return f"{module}.{getattr(function, '__qualname__', repr(function))}"


Decode = Callable[[str | bytes, int | None], Any]
"""A decode function: ``(stored payload, position) -> message``."""


def upcasting_decoder(
    key: Key, steps: list[Upcast], structure: Callable[[Payload, int | None], Any]
) -> Decode:
    """The decode function of payloads stored as ``key``: parsed, taken through ``steps``,
    then structured by ``structure`` (which raises DecodeError); every error names the
    stored type and, once an upcaster ran, the last one."""
    stored = key[0]
    ran = [step for step in steps if step.function is not None]
    after = f"after {ran[-1].label}: " if ran else ""

    def decode(payload: str | bytes, position: int | None = None) -> Any:
        try:
            data = json.loads(payload)
        except ValueError as exc:
            raise DecodeError(f"{exc}", position=position, type_name=stored) from exc
        if not isinstance(data, dict):
            reason = f"payload must be a JSON object, got {type(data).__name__}"
            raise DecodeError(reason, position=position, type_name=stored)
        for step in steps:
            data = step.apply(data, position=position, stored=stored)
        try:
            return structure(data, position)
        except DecodeError as exc:
            raise DecodeError(f"{after}{exc.reason}", position=position, type_name=stored) from exc

    return decode
