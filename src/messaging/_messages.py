"""Typed messages: attrs classes registered under a stable type name, and their envelopes."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from types import MemberDescriptorType
from typing import Any, TypeVar

import attrs
import cattrs
import cattrs.preconf.json
from cattrs.cols import is_any_set, is_sequence

from messaging._errors import DecodeError, RegistrationError
from messaging._json import make_dumps

_dumps = make_dumps(",", ":")
"""``json.dumps(value, separators=(",", ":"))`` without building an encoder per call."""

T = TypeVar("T")

_TYPE_ATTRIBUTE = "__message_type__"


class MessageRegistry:
    """Maps stable type names to attrs message classes and (un)structures their payloads."""

    def __init__(self) -> None:
        self._by_name: dict[str, type] = {}
        self._converter = _strict_converter()
        self._quick_converter = self._converter.copy(detailed_validation=False)
        self._decoders: dict[str, _Decoder] = {}

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
        self._decoders[name] = _Decoder(
            cls,
            name,
            strict=self._converter.get_structure_hook(cls),
            quick=self._quick_converter.get_structure_hook(cls),
        )

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
        return name, _dumps(self._converter.unstructure(message))

    def decode(self, type_name: str, payload: str | bytes, position: int | None = None) -> Any:
        """Turn a stored payload back into its message; DecodeError names position and type."""
        return self.decoder(type_name)(payload, position)

    def decoder(self, type_name: str) -> Callable[[str | bytes, int | None], Any]:
        """The decode function of one type, ``(payload, position) -> message``, for hot loops;
        for an unknown type, one that raises DecodeError."""
        decoder = self._decoders.get(type_name)
        if decoder is None:

            def unknown(_payload: str | bytes, position: int | None) -> Any:
                raise DecodeError("unknown message type", position=position, type_name=type_name)

            return unknown
        return decoder.decode


class _Decoder:
    """Decodes the payloads of one message class: a quick path for well-formed payloads,
    and the strict path, with detailed errors, for everything else.

    The quick path accepts exactly what the strict path accepts and builds the same
    object; whenever it has any doubt it defers to the strict path, which raises the
    detailed :class:`DecodeError`. For a flat class (:func:`_flat_decoder`) the whole
    quick path is one generated function, :attr:`decode`.
    """

    __slots__ = ("cls", "decode", "name", "quick", "strict")

    def __init__(
        self,
        cls: type,
        name: str,
        *,
        strict: Callable[[Any, Any], Any],
        quick: Callable[[Any, Any], Any],
    ) -> None:
        self.cls = cls
        self.name = name
        self.strict = strict
        self.quick = quick
        self.decode: Callable[[str | bytes, int | None], Any] = (
            _flat_decoder(cls, self.decode_strictly) or self._decode
        )

    def _decode(self, payload: str | bytes, position: int | None = None) -> Any:
        if type(payload) is str:
            try:
                data, end = _scan_json(payload, 0)
                if end == len(payload) and type(data) is dict:
                    return self.quick(data, self.cls)
            except Exception:
                pass  # decoded again below, with the error it deserves
        return self.decode_strictly(payload, position)

    def decode_strictly(self, payload: str | bytes, position: int | None = None) -> Any:
        """The strict path: the message, or DecodeError naming what is wrong."""
        try:
            data = json.loads(payload)
            if not isinstance(data, dict):
                raise TypeError(f"payload must be a JSON object, got {type(data).__name__}")
            return self.strict(data, self.cls)
        except (ValueError, TypeError, KeyError, cattrs.BaseValidationError) as exc:
            raise DecodeError(_describe(exc), position=position, type_name=self.name) from exc


_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
"""What ``json.loads`` runs on a str, without its Python-level checks: (value, end)."""

_EXACT_CHECKS = {
    str: "type({v}) is str",
    int: "type({v}) is int",
    bool: "type({v}) is bool",
    float: "(type({v}) is float or type({v}) is int)",
}


def _flat_decoder(
    cls: type, strictly: Callable[[str | bytes, int | None], Any]
) -> Callable[[str | bytes, int | None], Any] | None:
    """For a class whose fields are all str/int/float/bool, a generated decode function: it
    scans a str payload, checks that it holds exactly the fields (defaults or not) with
    their exact types inline and builds the object, or hands the payload to ``strictly``
    (a payload with a key missing, say). None for other classes."""
    attrs.resolve_types(cls)
    fields = attrs.fields(cls)
    hints: dict[str, Any] = {f.name: f.type for f in fields}
    if not fields or any(not f.init or hints[f.name] not in _EXACT_CHECKS for f in fields):
        return None
    names = [f"v{i}" for i in range(len(fields))]
    checks = " and ".join(
        _EXACT_CHECKS[hints[f.name]].format(v=v) for f, v in zip(fields, names, strict=True)
    )
    values = [
        f"float({v})" if hints[f.name] is float else v for f, v in zip(fields, names, strict=True)
    ]
    namespace: dict[str, Any] = {"cls": cls, "scan": _scan_json, "strictly": strictly}
    slots = _slot_setters(cls, fields)
    if slots is None:
        arguments = ", ".join(f"{f.alias}={v}" for f, v in zip(fields, values, strict=True))
        build = f"return cls({arguments})"
    else:
        namespace["new"] = object.__new__
        namespace.update({f"set{i}": setter for i, setter in enumerate(slots)})
        build = "; ".join(
            ["m = new(cls)", *(f"set{i}(m, {v})" for i, v in enumerate(values)), "return m"]
        )
    size = len(fields)
    source = (
        "def decode(payload, position=None):\n"
        "    if type(payload) is str:\n"
        "        try:\n"
        "            data, end = scan(payload, 0)\n"
        f"            if end == len(payload) and type(data) is dict and len(data) == {size}:\n"
        f"                {', '.join(names)}, = {', '.join(f'data[{f.name!r}]' for f in fields)},\n"
        f"                if {checks}:\n"
        f"                    {build}\n"
        "        except Exception:\n"
        "            pass\n"
        "    return strictly(payload, position)\n"
    )
    exec(compile(source, f"<message decoder {cls.__qualname__}>", "exec"), namespace)
    decode: Callable[[str | bytes, int | None], Any] = namespace["decode"]
    return decode


def quick_decoder(
    cls: type, strictly: Callable[[str | bytes, int | None], Any]
) -> Callable[[str | bytes, int | None], Any]:
    """A decode function ``(payload, position) -> instance of cls`` for hot loops: a
    generated quick path for a flat attrs class (str/int/float/bool fields), which defers
    to ``strictly`` whenever it has any doubt; ``strictly`` itself for other classes."""
    return _flat_decoder(cls, strictly) or strictly


def _slot_setters(
    cls: type, fields: Sequence[attrs.Attribute[Any]]
) -> list[Callable[[Any, Any], None]] | None:
    """The slot setters that build an instance of ``cls`` exactly as its ``__init__`` would,
    or None unless that ``__init__`` only stores its arguments: generated by attrs (per
    ``attrs.inspect``, attrs 25.4 and later), slotted, no cached hash, and no validator,
    converter or pre/post-init hook to run."""
    inspect = getattr(attrs, "inspect", None)
    if inspect is None:
        return None
    props = inspect(cls)
    if (
        not props.added_init
        or not props.is_slotted
        or props.is_exception
        or hasattr(cls, "__attrs_pre_init__")
        or hasattr(cls, "__attrs_post_init__")
        or any(f.validator is not None or f.converter is not None for f in fields)
    ):
        return None
    slots = {name for base in cls.__mro__ for name in base.__dict__.get("__slots__", ())}
    if slots - {"__weakref__"} != {f.name for f in fields}:
        return None  # a slot its __init__ fills that is not a field (a cached hash)
    slot_fields = [getattr(cls, f.name, None) for f in fields]
    setters = [s.__set__ for s in slot_fields if isinstance(s, MemberDescriptorType)]
    return setters if len(setters) == len(fields) else None


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

    # Collections keep cattrs' own hooks (lists, tuples, sets), behind a guard that the
    # JSON value is an array: a string is never split into its characters. The hooks come
    # from a copy taken before the guard exists; collections nested inside collections
    # are structured by that copy, so only the outer array is guarded there.
    unguarded = converter.copy()

    def collection_factory(type_: Any, _conv: Any) -> Callable[[Any, Any], Any]:
        inner = unguarded.get_structure_hook(type_)

        def structure(value: Any, cls: Any) -> Any:
            if not isinstance(value, list):
                raise TypeError(f"expected an array, got {type(value).__name__}")
            return inner(value, cls)

        return structure

    converter.register_structure_hook_factory(
        lambda t: is_sequence(t) or is_any_set(t), collection_factory
    )
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


MESSAGE_ID_HEADER = "message-id"
"""The header holding a sent message's id (see :meth:`MessageStore.send`)."""


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

    @property
    def message_id(self) -> str | None:
        """The id a sender gave the message, if any (every sent message has one)."""
        value = self.headers.get(MESSAGE_ID_HEADER)
        return value if isinstance(value, str) else None
