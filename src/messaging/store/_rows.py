"""What one message is as the store writes and reads it: the rows appended and the rows
a consumer applies, partition keys and the ids every message carries."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any, Final

import attrs

from messaging._json import make_dumps
from messaging._messages import MESSAGE_ID_HEADER

_dumps = make_dumps()
"""``json.dumps`` of stored headers, without its per-call set-up."""


def partition_hash(key: str) -> int:
    """CRC32 of a partition key: the same value on every backend and every host."""
    return zlib.crc32(key.encode("utf-8"))


INSERTED = (
    "tenant",
    "position",
    "topic",
    "source",
    "version",
    "type",
    "payload",
    "headers",
    "partition_hash",
    "recorded_at",
    "payload_version",
)
"""The columns of an appended message's row, in the order ``MessageStore.append_encoded``
gives them."""


def headers_json(headers: Mapping[str, Any] | None) -> str | None:
    """``headers`` as stored: JSON, or None for none. A lone message id (what a send
    carries) of printable ASCII but ``"`` and ``\\`` (which ``json.dumps`` leaves as they
    are) is formatted directly, to the same text."""
    if not headers:
        return None
    if (
        len(headers) == 1
        and type(message_id := headers.get(MESSAGE_ID_HEADER)) is str
        and message_id.isascii()
        and message_id.isprintable()
        and '"' not in message_id
        and "\\" not in message_id
    ):
        return f'{{"{MESSAGE_ID_HEADER}": "{message_id}"}}'
    return _dumps(headers)


def partition_of(key: str, partitions: int) -> int:
    """The partition a key falls into for a consumer with ``partitions`` partitions."""
    return partition_hash(key) % partitions


StoredRow = tuple[Any, ...]
"""A stored message as a consumer applies it (:meth:`MessageStore.read_batch`), a plain
tuple indexed by :data:`POSITION`, :data:`TYPE` (the stored type name), :data:`PAYLOAD`,
:data:`PAYLOAD_VERSION` (the version of its shape) and, unless read without it,
:data:`PARTITION_HASH` (its partition is this modulo the partition count; see
:func:`partition_in`) and, when read with it, :data:`SOURCE` (read only while a
partition has parked sources)."""
POSITION: Final = 0
TYPE: Final = 1
PAYLOAD: Final = 2
PAYLOAD_VERSION: Final = 3
PARTITION_HASH: Final = 4
SOURCE: Final = 5


def partition_in(row: StoredRow, partitions: int) -> int | None:
    """The partition of ``row`` for ``partitions`` partitions; None when it was read
    without its partition hash (a one-lane worker's rows: looked up if ever needed)."""
    return row[PARTITION_HASH] % partitions if len(row) > PARTITION_HASH else None


@attrs.define(frozen=True, kw_only=True)
class NewMessage:
    """A message ready to append: already encoded, with an optional expected source version."""

    topic: str
    source: str
    type: str
    payload: str
    headers: Mapping[str, Any] | None = None
    payload_version: int = 1
    """The version of the payload's shape (its class's declared version)."""

    def __attrs_post_init__(self) -> None:
        # One quick test of the three ids (a batch builds thousands); the error names the
        # first bad one.
        if not (is_plain_id(self.topic) and is_plain_id(self.source) and is_plain_id(self.type)):
            for name in ("topic", "source", "type"):
                check_id(f"message {name}", getattr(self, name))
        version = self.payload_version
        if type(version) is not int or version < 1:
            raise ValueError(
                f"message payload_version must be an integer of at least 1, got {version!r}"
            )


_new_object = object.__new__
_set_topic, _set_source, _set_type, _set_payload, _set_headers, _set_version = (
    NewMessage.__dict__[field].__set__
    for field in ("topic", "source", "type", "payload", "headers", "payload_version")
)


def registered_message(
    topic: str,
    source: str,
    type_name: str,
    payload: str,
    headers: Mapping[str, Any] | None,
    payload_version: int,
) -> NewMessage:
    """``NewMessage(...)`` of a message the registry just encoded (``type_name`` and
    ``payload_version`` are its): topic and source checked as there, without attrs'
    frozen set-up per field (a batch sends thousands)."""
    if not (is_plain_id(topic) and is_plain_id(source)):  # the checked way: its error
        return NewMessage(
            topic=topic,
            source=source,
            type=type_name,
            payload=payload,
            headers=headers,
            payload_version=payload_version,
        )
    message: NewMessage = _new_object(NewMessage)
    _set_topic(message, topic)
    _set_source(message, source)
    _set_type(message, type_name)
    _set_payload(message, payload)
    _set_headers(message, headers)
    _set_version(message, payload_version)
    return message


def is_plain_id(value: object) -> bool:
    """Whether :func:`check_id` accepts ``value`` for sure (a plain ``str``): the quick test
    before it, so that hot loops format the error's subject only for an error."""
    return type(value) is str and 0 < len(value) <= 200 and value == value.strip()


def check_id(what: str, value: object) -> None:
    """Refuse an id that is not 1 to 200 characters, or that starts or ends with whitespace.

    Ids are compared exactly on every backend; MySQL's PAD SPACE collations would ignore
    trailing spaces, so ids with surrounding whitespace are refused outright."""
    if not isinstance(value, str) or not value or len(value) > 200:
        raise ValueError(f"{what} must be a string of 1 to 200 characters, got {value!r}")
    if value != value.strip():
        raise ValueError(f"{what} {value!r} must not start or end with whitespace")
