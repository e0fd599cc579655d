"""Typed messages: attrs classes registered under a stable type name, and their envelopes."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
import cattrs.preconf.json
from cattrs.cols import is_sequence, list_structure_factory

from messaging.errors import DecodeError, RegistrationError

T = TypeVar("T")

_TYPE_ATTRIBUTE = "__message_type__"


class MessageRegistry:
    """Maps stable type names to attrs message classes and (un)structures their payloads."""

    def __init__(self) -> None:
        self._by_name: dict[str, type] = {}
        self._converter = _strict_converter()
        self._structure_fns: dict[str, Callable[[Any, Any], Any]] = {}
        # Decode fast path, by type name: (class, structure hook without detailed validation).
        self._fast_structure: dict[str, tuple[type, Callable[[Any, Any], Any]]] = {}

    def register(self, cls: type, name: str) -> None:
        """Register ``cls`` under ``name``; a redefinition of the same class path replaces it."""
        if not attrs.has(cls):
            raise RegistrationError(
                f"message type {name!r}: {cls.__qualname__} is not an attrs class"
            )
        existing = self._by_name.get(name)
        if existing is not None and _path(existing) != _path(cls):
            raise RegistrationError(
                f"message type name {name!r} is taken by {_path(existing)}; "
                f"cannot register {_path(cls)}"
            )
        self._by_name[name] = cls
        self._structure_fns[name] = self._converter.get_structure_hook(cls)

    def type_name(self, cls: type) -> str:
        """The registered name of ``cls``; RegistrationError if it is not a registered message."""
        name: str | None = cls.__dict__.get(_TYPE_ATTRIBUTE)
        if name is None or self._by_name.get(name) is not cls:
            raise RegistrationError(
                f"{_path(cls)} is not a registered message type; decorate it with @message(...)"
            )
        return name

    def is_registered(self, cls: object) -> bool:
        """Whether ``cls`` is a class registered here under its declared name."""
        name = getattr(cls, "__dict__", {}).get(_TYPE_ATTRIBUTE)
        return name is not None and self._by_name.get(name) is cls

    def class_for(self, name: str) -> type | None:
        """The class registered under ``name``, or None."""
        return self._by_name.get(name)

    def names(self) -> list[str]:
        """All registered type names, sorted."""
        return sorted(self._by_name)

    def encode(self, message: object) -> tuple[str, str]:
        """Return ``(type name, JSON payload)`` for a registered message instance."""
        name = self.type_name(type(message))
        return name, json.dumps(self._converter.unstructure(message), separators=(",", ":"))

    def decode(self, type_name: str, payload: str | bytes, position: int | None = None) -> Any:
        """Turn a stored payload back into its message; DecodeError names position and type."""
        fast = self._fast_structure.get(type_name)
        if fast is not None and type(payload) is str and fast[0] is self._by_name[type_name]:
            # For a valid payload, json's C scanner and a cattrs hook without detailed
            # validation build the same message as below, much faster. On any failure the
            # payload is decoded again below, which raises exactly what it always raised.
            try:
                data, end = _scan_json(payload, 0)
                if end == len(payload) and type(data) is dict:
                    return fast[1](data, fast[0])
            except Exception:
                pass
        structure = self._structure_fns.get(type_name)
        if structure is None:
            raise DecodeError("unknown message type", position=position, type_name=type_name)
        cls = self._by_name[type_name]
        if fast is None or fast[0] is not cls:
            plain = self._converter.copy(detailed_validation=False)
            self._fast_structure[type_name] = (cls, plain.get_structure_hook(cls))
        try:
            data = json.loads(payload)
            if not isinstance(data, dict):
                raise TypeError(f"payload must be a JSON object, got {type(data).__name__}")
            return structure(data, cls)
        except (ValueError, TypeError, KeyError, cattrs.BaseValidationError) as exc:
            raise DecodeError(_describe(exc), position=position, type_name=type_name) from exc


_scan_json: Callable[[str, int], tuple[Any, int]] = vars(json.JSONDecoder())["scan_once"]
"""What ``json.loads`` runs on a str, without its Python-level wrapping: (value, end)."""


def _strict_converter() -> cattrs.Converter:
    """A JSON converter that refuses wrong types instead of coercing them (no 1.5 -> 1,
    no "7" -> 7, no "abc" -> ["a", "b", "c"]): a payload that does not match its type must
    halt its partition, not be applied differently."""
    converter = cattrs.preconf.json.make_converter(forbid_extra_keys=True)

    def exact(*kinds: type) -> Callable[[Any, Any], Any]:
        def structure(value: Any, cls: Any) -> Any:
            if isinstance(value, bool) and bool not in kinds:
                raise TypeError(f"expected {cls.__name__}, got a boolean")
            if not isinstance(value, kinds):
                raise TypeError(f"expected {cls.__name__}, got {type(value).__name__}")
            number: Any = value
            return float(number) if cls is float else number

        return structure

    converter.register_structure_hook(str, exact(str))
    converter.register_structure_hook(int, exact(int))
    converter.register_structure_hook(float, exact(int, float))
    converter.register_structure_hook(bool, exact(bool))

    def sequence_factory(type_: Any, conv: Any) -> Callable[[Any, Any], Any]:
        inner = list_structure_factory(type_, conv)

        def structure(value: Any, cls: Any) -> Any:
            if not isinstance(value, list):
                raise TypeError(f"expected a list, got {type(value).__name__}")
            return inner(value, cls)

        return structure

    converter.register_structure_hook_factory(is_sequence, sequence_factory)
    return converter


def _describe(exc: BaseException) -> str:
    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(exc, path="payload"))
    return f"{type(exc).__name__}: {exc}"


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


registry = MessageRegistry()
"""The process-wide registry that :func:`message` registers into."""


def message(name: str) -> Callable[[type[T]], type[T]]:
    """Class decorator: make an attrs class a message stored under the stable type ``name``.

    The name, not the Python path, is what the store records, so classes can move
    between modules without breaking stored messages.
    """
    if not name or not isinstance(name, str):
        raise RegistrationError(f"a message type name must be a non-empty string, got {name!r}")

    def decorate(cls: type[T]) -> type[T]:
        setattr(cls, _TYPE_ATTRIBUTE, name)
        registry.register(cls, name)
        return cls

    return decorate


@attrs.define(frozen=True, slots=True)
class Envelope:
    """A stored message with its metadata, as handlers see it alongside the decoded body."""

    position: int
    topic: str
    source: str
    version: int
    type: str
    partition_hash: int
    recorded_at: float
    headers_json: str | None = attrs.field(default=None, repr=False)

    @property
    def headers(self) -> Mapping[str, Any]:
        """Message headers (message id, correlation, causation, trace context)."""
        return json.loads(self.headers_json) if self.headers_json else {}
