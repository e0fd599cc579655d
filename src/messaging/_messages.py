"""Typed messages: attrs classes registered under a stable type name, and their envelopes."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from types import MemberDescriptorType
from typing import Any, TypeVar

import attrs
import cattrs

from messaging._errors import DecodeError, RegistrationError
from messaging._json import make_dumps
from messaging._structure import describe, strict_converter
from messaging._upcasting import Decode, Key, UpcasterTable, upcasting_decoder

_dumps = make_dumps(",", ":")
"""``json.dumps(value, separators=(",", ":"))`` without building an encoder per call."""

T = TypeVar("T")

_TYPE_ATTRIBUTE = "__message_type__"


class MessageRegistry:
    """Maps stable type names to attrs message classes and (un)structures their payloads."""

    def __init__(self) -> None:
        self._by_name: dict[str, type] = {}
        self._converter = strict_converter()
        self._quick_converter = self._converter.copy(detailed_validation=False)
        self._decoders: dict[str, _Decoder] = {}
        self._versions: dict[str, int] = {}
        self._readers: dict[Key, Decode] = {}
        self._unstructurers: dict[type, Callable[[Any], Any]] = {}
        """Per registered class encoded since the last registration: its unstructure hook."""
        self.upcasters = UpcasterTable()
        """The upcasters and renames from older stored payloads (``messaging._upcasting``)."""

    def register(self, cls: type, name: str, version: int = 1) -> None:
        """Register ``cls`` under ``name`` at payload ``version``; a redefinition of the same
        class path replaces it."""
        if type(version) is not int or version < 1:
            raise RegistrationError(
                f"message type {name!r}: version must be an integer of at least 1, got {version!r}"
            )
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
        self._versions[name] = version
        self._readers.clear()
        self._unstructurers.clear()
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

    def version_of(self, name: str) -> int:
        """The current payload version of the type registered as ``name`` (1 if none)."""
        return self._versions.get(name, 1)

    def versions(self) -> Mapping[str, int]:
        """The current payload version of every registered type name."""
        return dict(self._versions)

    def add_upcaster(
        self, type_name: str, version: int, function: Callable[[Any], Any], to: str
    ) -> None:
        """Declare an upcaster (see :func:`upcaster`)."""
        self.upcasters.add(type_name, version, function, to)
        self._readers.clear()

    def add_rename(self, old: str, new: str) -> None:
        """Declare a rename (see :func:`rename`)."""
        self.upcasters.add_rename(old, new)
        self._readers.clear()

    def check_upcasters(self) -> None:
        """RegistrationError naming the type if some declared payload version cannot reach a
        current class (see :meth:`UpcasterTable.check`): run at start-up."""
        self.upcasters.check(self._versions)

    def reader(self, type_name: str, version: int) -> Decode:
        """The decode function of payloads stored as (``type_name``, ``version``): the
        generated decoder for a current version, the upcasters' way for an older one;
        for an unknown one, a function raising its error (UnknownPayloadVersion for a
        version newer than this code declares)."""
        key = (type_name, version)
        reader = self._readers.get(key)
        if reader is None:
            reader = self._readers[key] = self._reader(key)
        return reader

    def readers_of(self, name: str) -> dict[str, dict[int, Decode]]:
        """Every stored (type, version) that reaches the class registered as ``name``, as
        {stored type name: {version: its decode function}}."""
        current = (name, self._versions[name])
        found: dict[str, dict[int, Decode]] = {name: {current[1]: self.reader(*current)}}
        for key in self.upcasters.sources(self._versions):
            try:
                target, _ = self.upcasters.resolve(key, self._versions)
            except DecodeError:
                continue
            if target == current:
                found.setdefault(key[0], {})[key[1]] = self.reader(*key)
        return found

    def upcasts_to(self, name: str) -> list[str]:
        """The labels of the upcasters and renames on the ways to the class registered as
        ``name`` (what an instance reading it applies to older payloads), sorted."""
        labels: set[str] = set()
        for key in self.upcasters.sources(self._versions):
            try:
                target, steps = self.upcasters.resolve(key, self._versions)
            except DecodeError:
                continue
            if target == (name, self._versions[name]):
                labels.update(step.label for step in steps)
        return sorted(labels)

    def _reader(self, key: Key) -> Decode:
        upcasters, versions = self.upcasters, dict(self._versions)
        try:
            (name, _), steps = upcasters.resolve(key, versions)
        except DecodeError:

            def unreadable(_payload: str | bytes, position: int | None) -> Any:
                upcasters.resolve(key, versions, position=position)  # raises its error
                raise AssertionError(key)  # pragma: no cover (it raised above)

            return unreadable
        decoder = self._decoders[name]
        if not steps:
            return decoder.decode
        return upcasting_decoder(key, steps, decoder.structure)

    def encode(self, message: object) -> tuple[str, str]:
        """Return ``(type name, JSON payload)`` for a registered message instance."""
        cls = type(message)
        unstructure = self._unstructurers.get(cls)
        if unstructure is None:  # checked once per class: registered (else the reason)
            self.type_name(cls)
            unstructure = self._unstructurers[cls] = self._converter.get_unstructure_hook(cls)
        return cls.__dict__[_TYPE_ATTRIBUTE], _dumps(unstructure(message))

    def decode(
        self,
        type_name: str,
        payload: str | bytes,
        position: int | None = None,
        version: int | None = None,
    ) -> Any:
        """Turn a stored payload back into its message; DecodeError names position and type.
        With the stored payload ``version``, an older one is upcast (:meth:`reader`);
        without, it is read as the current version."""
        if version is not None:
            return self.reader(type_name, version)(payload, position)
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

    def structure(self, data: dict[str, Any], position: int | None = None) -> Any:
        """The message built from a payload already parsed (and upcast); DecodeError if it
        does not fit the class."""
        try:
            return self.strict(data, self.cls)
        except (ValueError, TypeError, KeyError, cattrs.BaseValidationError) as exc:
            raise DecodeError(describe(exc), position=position, type_name=self.name) from exc

    def decode_strictly(self, payload: str | bytes, position: int | None = None) -> Any:
        """The strict path: the message, or DecodeError naming what is wrong."""
        try:
            data = json.loads(payload)
            if not isinstance(data, dict):
                raise TypeError(f"payload must be a JSON object, got {type(data).__name__}")
            return self.strict(data, self.cls)
        except (ValueError, TypeError, KeyError, cattrs.BaseValidationError) as exc:
            raise DecodeError(describe(exc), position=position, type_name=self.name) from exc


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


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


registry = MessageRegistry()
"""The process-wide registry that :func:`message` registers into."""


def message(name: str, *, version: int = 1) -> Callable[[type[T]], type[T]]:
    """Class decorator: make an attrs class a message stored under the stable type ``name``.

    The name, not the Python path, is what the store records, so classes can move
    between modules without breaking stored messages. ``version`` is the version of the
    payload's shape, stored with every message: bump it when the class changes in a way
    older payloads do not fit, and declare an :func:`upcaster` from the previous one.
    """
    if not name or not isinstance(name, str):
        raise RegistrationError(f"a message type name must be a non-empty string, got {name!r}")

    def decorate(cls: type[T]) -> type[T]:
        setattr(cls, _TYPE_ATTRIBUTE, name)
        registry.register(cls, name, version)
        return cls

    return decorate


U = TypeVar("U", bound=Callable[[Any], Any])


def upcaster(type_name: str, version: int, *, to: str | None = None) -> Callable[[U], U]:
    """Function decorator: ``function(payload) -> payload`` turns a stored payload (a dict)
    of (``type_name``, ``version``) into one of (``to``, ``version`` + 1); ``to`` defaults
    to ``type_name`` (another name renames the type on the way). Typed: a function whose
    parameter is annotated with an attrs class of the old shape gets the payload
    structured into it; it may return an attrs instance of the next shape. Every read path applies
    the chain of upcasters from a stored version to its class's current one; the chains
    are checked when an instance starts."""

    def decorate(function: U) -> U:
        registry.add_upcaster(type_name, version, function, type_name if to is None else to)
        return function

    return decorate


def rename(old: str, new: str) -> None:
    """Declare that stored messages of type ``old`` (every version) are of type ``new``."""
    registry.add_rename(old, new)


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
    payload_version: int = 1
    """The version of the stored payload's shape (upcast to its class's current one)."""

    @property
    def headers(self) -> Mapping[str, Any]:
        """Message headers (message id, correlation, causation, trace context)."""
        return json.loads(self.headers_json) if self.headers_json else {}

    @property
    def message_id(self) -> str | None:
        """The id a sender gave the message, if any (every sent message has one)."""
        value = self.headers.get(MESSAGE_ID_HEADER)
        return value if isinstance(value, str) else None
