"""Message registry: encoding round trips, decode errors and registration errors."""

from __future__ import annotations

import json

import attrs
import cattrs.preconf.json
import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging import DecodeError, RegistrationError, handler, message
from messaging._consumers import consumer_spec
from messaging._messages import quick_decoder, registry
from projections import projection


@message("test.msg.nested")
@attrs.define(frozen=True)
class Nested:
    label: str
    weight: int


@message("test.msg.everything")
@attrs.define(frozen=True)
class Everything:
    text: str
    number: int
    tags: list[str]
    maybe: int | None
    maybe_text: str | None = None
    nested: list[Nested] = attrs.field(factory=list)


@message("test.msg.simple")
@attrs.define(frozen=True)
class Simple:
    name: str
    count: int


@attrs.define(frozen=True)
class NotAMessage:
    """An attrs class never decorated with @message."""

    name: str


nested = st.builds(Nested, label=st.text(), weight=st.integers())
everything = st.builds(
    Everything,
    text=st.text(),
    number=st.integers(min_value=-(2**70), max_value=2**70),
    tags=st.lists(st.text(), max_size=5),
    maybe=st.none() | st.integers(),
    maybe_text=st.none() | st.text(),
    nested=st.lists(nested, max_size=3),
)


# -- encode / decode ----------------------------------------------------------------------


@given(everything)
def test_encode_decode_round_trip(value: Everything) -> None:
    """Decoding what encode produced gives back an equal message under the same type name."""
    name, payload = registry.encode(value)
    assert name == "test.msg.everything"
    assert isinstance(json.loads(payload), dict)
    assert registry.decode(name, payload, position=7) == value


@given(everything)
def test_encoded_payload_is_plain_json_of_the_fields(value: Everything) -> None:
    """The payload is a JSON object keyed by exactly the attrs field names."""
    _, payload = registry.encode(value)
    assert set(json.loads(payload)) == {f.name for f in attrs.fields(Everything)}


def test_type_name_of_registered_class() -> None:
    """A decorated class is known under the name its decorator gave."""
    assert registry.type_name(Simple) == "test.msg.simple"
    assert registry.class_for("test.msg.simple") is Simple
    assert registry.is_registered(Simple)
    assert "test.msg.simple" in registry.names()


def test_decode_unknown_type_names_position_and_type() -> None:
    """Decoding an unregistered type name raises DecodeError carrying position and type."""
    with pytest.raises(DecodeError) as info:
        registry.decode("test.msg.no-such-type", '{"a": 1}', position=42)
    assert info.value.position == 42
    assert info.value.type_name == "test.msg.no-such-type"
    assert "42" in str(info.value)
    assert "test.msg.no-such-type" in str(info.value)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param("{not json", id="malformed-json"),
        pytest.param("", id="empty"),
        pytest.param('{"name": "x"}', id="missing-field"),
        pytest.param('{"name": "x", "count": "many"}', id="int-not-a-number"),
        pytest.param('{"name": "x", "count": 1, "extra": 2}', id="extra-field"),
    ],
)
def test_decode_bad_payload_raises_decode_error_with_position(payload: str) -> None:
    """A payload that is not a valid encoding of the type raises DecodeError naming the position."""
    with pytest.raises(DecodeError) as info:
        registry.decode("test.msg.simple", payload, position=9)
    assert info.value.position == 9
    assert info.value.type_name == "test.msg.simple"
    assert "position 9" in str(info.value)
    assert "test.msg.simple" in str(info.value)
    assert info.value.reason


def test_decode_missing_field_names_the_field() -> None:
    """The reason of a missing field names that field."""
    with pytest.raises(DecodeError) as info:
        registry.decode("test.msg.simple", '{"name": "x"}', position=1)
    assert "count" in info.value.reason


@pytest.mark.parametrize("payload", ["[1, 2]", '"text"', "5", "null"])
def test_decode_non_object_payload_raises_decode_error(payload: str) -> None:
    """A JSON payload that is not an object raises DecodeError, not a bare builtin error."""
    with pytest.raises(DecodeError) as info:
        registry.decode("test.msg.simple", payload, position=3)
    assert info.value.position == 3


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param('{"name": 5, "count": 1}', id="int-for-str"),
        pytest.param('{"name": "x", "count": "7"}', id="numeric-string-for-int"),
        pytest.param('{"name": "x", "count": 1.9}', id="float-for-int"),
        pytest.param('{"name": "x", "count": true}', id="bool-for-int"),
    ],
)
def test_decode_wrong_field_type_raises_decode_error(payload: str) -> None:
    """A field of the wrong JSON type is rejected rather than silently coerced."""
    with pytest.raises(DecodeError) as info:
        registry.decode("test.msg.simple", payload, position=4)
    assert info.value.position == 4


def test_decode_string_for_list_field_raises_decode_error() -> None:
    """A string where a list is declared is rejected rather than split into characters."""
    payload = '{"text": "t", "number": 1, "tags": "abc", "maybe": null}'
    with pytest.raises(DecodeError):
        registry.decode("test.msg.everything", payload, position=5)


def test_decode_accepts_bytes_payload() -> None:
    """A payload read back as bytes decodes like the same text."""
    assert registry.decode("test.msg.simple", b'{"name": "n", "count": 2}') == Simple("n", 2)


# -- registration errors --------------------------------------------------------------------


def test_register_non_attrs_class_fails_naming_it() -> None:
    """Decorating a plain class as a message fails with RegistrationError naming the class."""
    with pytest.raises(RegistrationError, match="PlainClass"):

        @message("test.msg.plain")
        class PlainClass:
            name: str

    assert registry.class_for("test.msg.plain") is None


def test_register_duplicate_name_for_different_class_fails_naming_both() -> None:
    """A type name already taken by another class cannot be registered again."""
    with pytest.raises(RegistrationError) as info:

        @message("test.msg.simple")
        @attrs.define
        class Impostor:
            name: str

    text = str(info.value)
    assert "test.msg.simple" in text
    assert "Impostor" in text
    assert f"{Simple.__module__}.Simple" in text
    assert registry.class_for("test.msg.simple") is Simple


@pytest.mark.parametrize("name", ["", None, 5])
def test_message_name_must_be_non_empty_string(name: object) -> None:
    """A message type name must be a non-empty string."""
    with pytest.raises(RegistrationError):
        message(name)  # type: ignore[arg-type]


def test_type_name_of_undecorated_class_fails_naming_it() -> None:
    """Asking for the type name of an undecorated class fails with RegistrationError naming it."""
    with pytest.raises(RegistrationError, match="NotAMessage"):
        registry.type_name(NotAMessage)
    with pytest.raises(RegistrationError, match="NotAMessage"):
        registry.encode(NotAMessage("x"))
    assert not registry.is_registered(NotAMessage)


def test_handler_of_undecorated_class_fails_naming_it() -> None:
    """A consumer whose handler takes an undecorated class fails to register, naming the class."""

    @projection("test-msg-undecorated-consumer", topics="t")
    class Consumer:
        @handler
        def on(self, event: NotAMessage) -> None:
            pass

    with pytest.raises(RegistrationError) as info:
        consumer_spec(Consumer)
    assert "NotAMessage" in str(info.value)
    assert "Consumer.on" in str(info.value)


@message("test.msg.collections")
@attrs.define(frozen=True)
class Collections:
    numbers: tuple[int, ...]
    tags: frozenset[str]


def test_collections_keep_their_types_and_refuse_strings() -> None:
    """A tuple field decodes to a tuple, a set field to a set; a JSON string is refused."""
    decoded = registry.decode("test.msg.collections", '{"numbers": [1, 2], "tags": ["a"]}', 3)
    assert decoded == Collections(numbers=(1, 2), tags=frozenset({"a"}))
    assert isinstance(decoded.numbers, tuple)
    for payload in ('{"numbers": "12", "tags": []}', '{"numbers": [], "tags": "abc"}'):
        with pytest.raises(DecodeError) as raised:
            registry.decode("test.msg.collections", payload, 3)
        assert raised.value.position == 3


# -- the quick decoder of flat classes ------------------------------------------------------

_built: list[str] = []


def _upper(text: str) -> str:
    return text.upper()


@message("test.msg.checked")
@attrs.define(frozen=True)
class Checked:
    """Flat, but its __init__ does more than store: it validates and converts."""

    name: str = attrs.field(converter=_upper)
    count: int = attrs.field(validator=attrs.validators.gt(0))


@message("test.msg.hooked")
@attrs.define(frozen=True)
class Hooked:
    name: str

    def __attrs_post_init__(self) -> None:
        _built.append(self.name)


@message("test.msg.pre-hooked")
@attrs.define(frozen=True)
class PreHooked:
    name: str

    def __attrs_pre_init__(self) -> None:
        _built.append("pre")


@message("test.msg.cached-hash")
@attrs.frozen(cache_hash=True)
class CachedHash:
    name: str
    ratio: float


def test_flat_messages_decode_as_their_init_builds_them() -> None:
    """The generated decoder of a flat class builds what its __init__ builds: validators,
    converters and post-init hooks run, a cached hash works, an int is a float field's
    float; a plain frozen class gets an equal instance."""
    assert registry.decode("test.msg.simple", '{"name":"n","count":2}') == Simple("n", 2)
    assert registry.decode("test.msg.checked", '{"name":"n","count":2}') == Checked("N", 2)
    with pytest.raises(DecodeError) as raised:
        registry.decode("test.msg.checked", '{"name":"n","count":0}', 11)
    assert raised.value.position == 11
    _built.clear()
    assert registry.decode("test.msg.hooked", '{"name":"h"}') == Hooked("h")
    assert registry.decode("test.msg.pre-hooked", '{"name":"p"}') == PreHooked("p")
    assert _built == ["h", "h", "pre", "pre"]  # the decoded one, then the one compared with
    decoded = registry.decode("test.msg.cached-hash", '{"name":"c","ratio":2}')
    assert hash(decoded) == hash(CachedHash("c", 2.0))
    assert type(decoded.ratio) is float


@message("test.msg.defaulted")
@attrs.define(frozen=True)
class Defaulted:
    name: str
    count: int = 0
    ratio: float = 1.0


def test_flat_messages_with_defaults_decode_as_the_strict_path_does() -> None:
    """A flat class with defaults: a payload holding every field takes the generated quick
    path, one without a defaulted field the strict path; both build what __init__ builds,
    and a wrong type is still a DecodeError."""
    decode = registry.decoder("test.msg.defaulted")
    assert decode('{"name":"a","count":3,"ratio":2}', None) == Defaulted("a", 3, 2.0)
    assert type(decode('{"name":"a","count":3,"ratio":2}', None).ratio) is float
    assert decode('{"name":"a"}', None) == Defaulted("a")
    with pytest.raises(DecodeError, match="count"):
        decode('{"name":"a","count":"3","ratio":2.0}', 5)


@attrs.define
class _State:
    fired: int = 0
    label: str = ""


@pytest.mark.parametrize(
    "stored",
    ['{"fired": 2, "label": "x"}', '{"fired": "2", "label": "x"}', '{"label": "x"}', "{}"],
)
def test_a_quick_decoder_of_a_saga_state_builds_what_the_converter_builds(stored: str) -> None:
    """Saga states are read through :func:`quick_decoder`, deferring to their converter:
    the same state for a stored one, and for one the converter coerces or completes."""
    converter = cattrs.preconf.json.make_converter()
    decode = quick_decoder(_State, lambda payload, _position: converter.loads(payload, _State))
    assert decode(stored, None) == converter.loads(stored, _State)
