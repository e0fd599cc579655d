"""Consistency tokens: what an append wrote, in a short string an application can pass on.

A token names, for one tenant, marks ``(topic, partition hash, position)``: the last
position appended to each (topic, partition hash). A consumer that reads the topic has
applied a mark once the partition the hash falls into (``hash % partitions``) holds no
message of its topics and types up to the position after its committed checkpoint
(:mod:`messaging.waits._progress`). Appends of one tenant commit in position order (a
position is reserved under the tenant's counter row lock, held until the commit), so a
checkpoint past a position has applied every message of its partition before it.

A token with more than :data:`MAX_MARKS` marks keeps, for each topic, only its last
position with no hash (every partition of the topic): still correct, it only waits for
more. The text is ``rw1.<base64url JSON>.<crc32>``: opaque to applications, short enough
for an HTTP header or a cookie; the checksum finds a truncated or mistyped token. It is
not a signature: a forged token names positions of its own tenant only, and one naming a
position that holds no message of its topic is refused when waited on.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from messaging._errors import ProjectionsError
from messaging.store._rows import NewMessage, partition_hash

__all__ = [
    "MAX_MARKS",
    "Appended",
    "ConsistencyToken",
    "InvalidToken",
    "Outgoing",
    "Sent",
    "TokenNotKnown",
    "Written",
]

PREFIX = "rw1"
"""The format's name and version, the token's first field."""
MAX_MARKS = 64
"""Marks kept before a token keeps only each topic's last position (see the module)."""
MAX_LENGTH = 8192
"""The longest text :meth:`ConsistencyToken.parse` reads."""
_HASHES = 1 << 32  # partition hashes are CRC32 values

Mark = tuple[str, int | None, int]
"""(topic, partition hash or None for every partition of the topic, position)."""


class InvalidToken(ProjectionsError, ValueError):
    """A consistency token that cannot be used: malformed, truncated, altered, or of
    another tenant; the message says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid consistency token: {reason}")
        self.reason = reason


def _compact(marks: Iterable[Mark]) -> tuple[Mark, ...]:
    """The last position of each (topic, hash), sorted; past :data:`MAX_MARKS`, each
    topic's last position for every partition. A topic marked for every partition keeps
    only that mark."""
    last: dict[tuple[str, int | None], int] = {}
    for topic, h, position in marks:
        last[(topic, h)] = max(position, last.get((topic, h), 0))
    whole = {topic for topic, h in last if h is None or len(last) > MAX_MARKS}
    kept: dict[tuple[str, int | None], int] = {}
    for (topic, h), position in last.items():
        key = (topic, None) if topic in whole else (topic, h)
        kept[key] = max(position, kept.get(key, 0))
    ordered = sorted(kept.items(), key=lambda item: (item[0][0], item[0][1] or -1))
    return tuple((topic, h, position) for (topic, h), position in ordered)


@attrs.frozen
class ConsistencyToken:
    """What appends wrote (see the module). ``str(token)`` is its text, which
    :meth:`parse` reads back; ``a | b`` (or :meth:`combine`) covers both."""

    tenant: str
    marks: tuple[Mark, ...] = attrs.field(converter=_compact)

    @classmethod
    def of(cls, tenant: str, written: Iterable[tuple[str, int, int]]) -> ConsistencyToken:
        """The token of messages written as ``(topic, partition hash, position)``."""
        return cls(tenant, tuple((topic, h, p) for topic, h, p in written))

    @classmethod
    def combine(cls, *tokens: ConsistencyToken | str) -> ConsistencyToken:
        """One token covering all of ``tokens`` (texts are parsed); they must share a tenant."""
        if not tokens:
            raise ValueError("combine needs at least one token")
        parsed = [t if isinstance(t, ConsistencyToken) else cls.parse(t) for t in tokens]
        tenants = {t.tenant for t in parsed}
        if len(tenants) > 1:
            raise InvalidToken(f"tokens of different tenants {sorted(tenants)} cannot combine")
        return cls(parsed[0].tenant, tuple(m for t in parsed for m in t.marks))

    def __or__(self, other: ConsistencyToken) -> ConsistencyToken:
        return ConsistencyToken.combine(self, other)

    @property
    def positions(self) -> dict[int, tuple[str, int | None]]:
        """Each marked position → (topic, partition hash or None)."""
        return {p: (topic, h) for topic, h, p in self.marks}

    def __str__(self) -> str:
        topics: dict[str, list[list[int | None]]] = {}
        for topic, h, position in self.marks:
            topics.setdefault(topic, []).append([h, position])
        body = json.dumps([self.tenant, topics], separators=(",", ":")).encode("utf-8")
        encoded = base64.urlsafe_b64encode(body).rstrip(b"=").decode("ascii")
        return f"{PREFIX}.{encoded}.{zlib.crc32(encoded.encode('ascii')):08x}"

    @classmethod
    def parse(cls, text: object, *, tenant: str | None = None) -> ConsistencyToken:
        """The token of ``text`` (what ``str(token)`` gave); :class:`InvalidToken` naming
        what is wrong otherwise, or when it is not of ``tenant`` (if given)."""
        if not isinstance(text, str):
            raise InvalidToken(f"expected a string, got {type(text).__name__}")
        text = text.strip()
        if not text:
            raise InvalidToken("empty")
        if len(text) > MAX_LENGTH:
            raise InvalidToken(f"{len(text)} characters, longer than {MAX_LENGTH}")
        fields = text.split(".")
        if fields[0] != PREFIX:
            raise InvalidToken(f"does not start with {PREFIX!r} (not a token, or another format)")
        if len(fields) != 3:
            raise InvalidToken("expected 3 fields separated by '.' (truncated?)")
        _, encoded, checksum = fields
        if checksum != f"{zlib.crc32(encoded.encode('ascii', 'replace')):08x}":
            raise InvalidToken("checksum does not match (truncated or altered)")
        try:
            body = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            data = json.loads(body.decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise InvalidToken("its body is not base64url JSON") from None
        token = cls(_tenant_of(data), _marks_of(data))
        if tenant is not None and token.tenant != tenant:
            raise InvalidToken(
                f"it was issued for tenant {token.tenant!r}, this database serves {tenant!r}"
            )
        return token


def _tenant_of(data: Any) -> str:
    if not (isinstance(data, list) and len(data) == 2 and isinstance(data[1], dict)):
        raise InvalidToken("its body is not [tenant, {topic: marks}]")
    if not isinstance(data[0], str) or not data[0]:
        raise InvalidToken("its tenant is not a non-empty string")
    return data[0]


def _marks_of(data: Any) -> tuple[Mark, ...]:
    marks: list[Mark] = []
    for topic, entries in data[1].items():
        if not topic or not isinstance(entries, list) or not entries:
            raise InvalidToken(f"topic {topic!r} has no marks")
        for entry in entries:
            if not (isinstance(entry, list) and len(entry) == 2):
                raise InvalidToken(f"a mark of topic {topic!r} is not [hash, position]")
            h, position = entry
            if h is not None and not (_is_int(h) and 0 <= h < _HASHES):
                raise InvalidToken(f"partition hash {h!r} of topic {topic!r} is out of range")
            if not (_is_int(position) and 0 < position < 1 << 63):
                raise InvalidToken(f"position {position!r} of topic {topic!r} is out of range")
            marks.append((topic, h, position))
    return tuple(marks)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Appended(list[int]):
    """The positions of an append (a list, as before), with :attr:`token`: the
    consistency token of what it wrote. Valid once the append's transaction commits."""

    _token: ConsistencyToken | Callable[[], ConsistencyToken]

    def __init__(
        self, positions: Sequence[int], token: ConsistencyToken | Callable[[], ConsistencyToken]
    ) -> None:
        """``token``, or what makes it when first asked for (most appends never are)."""
        super().__init__(positions)
        self._token = token

    @property
    def token(self) -> ConsistencyToken:
        """The token of the messages appended."""
        token = self._token
        if not isinstance(token, ConsistencyToken):
            token = self._token = token()
        return token


class TokenNotKnown(ProjectionsError):
    """The token of a message a handler sent or appended, asked for before it was written
    (positions are given when the batch's buffered writes are flushed), or of one that
    was not written (a replay does not send again what the live version sent)."""


NOT_FLUSHED = (
    "a handler's sends and appends get their positions when the batch's writes are "
    "flushed: call ctx.flush() first, or read the token after the batch"
)
NOT_SENT_AGAIN = (
    "not written: a version being built does not send or append again what the live "
    "version sent for this message"
)


def token_of(tenant: str, first: int, messages: Sequence[NewMessage]) -> ConsistencyToken:
    """The token of ``messages`` appended from position ``first`` on."""
    marks = ((m.topic, partition_hash(m.source), first + i) for i, m in enumerate(messages))
    return ConsistencyToken.of(tenant, marks)


class Outgoing:
    """The messages a handler context sends and appends until its next flush, and once
    flushed their positions and tenant: what :class:`Written` tokens are made from."""

    __slots__ = ("messages", "positions", "tenant")

    def __init__(self) -> None:
        self.messages: list[NewMessage] = []
        self.positions: Sequence[int] | None = None
        self.tenant = ""

    def written(self, tenant: str, positions: Sequence[int]) -> None:
        """Record that the messages were appended at ``positions`` for ``tenant``."""
        self.tenant, self.positions = tenant, positions


class Written:
    """What a handler appended (``ctx.append``): :attr:`token` is the consistency token of
    the message, known once the batch's writes are flushed (``ctx.flush()`` or the batch's
    end; valid once the batch commits)."""

    __slots__ = ("_index", "_outgoing", "_token", "_why")

    def __init__(
        self,
        outgoing: Outgoing | None = None,
        index: int = 0,
        why: str = NOT_FLUSHED,
        token: ConsistencyToken | None = None,
    ) -> None:
        """The ``index``-th message of ``outgoing`` (``why`` its token is not known while
        it is not flushed), or a message written with ``token``."""
        self._outgoing = outgoing
        self._index = index
        self._why = why
        self._token = token

    @property
    def token(self) -> ConsistencyToken:
        """The message's token; :class:`TokenNotKnown` before it is written."""
        if self._token is None:
            outgoing = self._outgoing
            if outgoing is None or outgoing.positions is None:
                raise TokenNotKnown(self._why)
            index = self._index
            position = outgoing.positions[index]
            self._token = token_of(outgoing.tenant, position, outgoing.messages[index : index + 1])
        return self._token


class Sent(str):
    """The message id of a send (a string, as before), with :attr:`token`: the
    consistency token of the message sent. Valid once the send's transaction commits;
    from a handler (``ctx.send``) known once the batch's writes are flushed, like
    :class:`Written`."""

    _written: Written

    def __new__(cls, message_id: str, token: ConsistencyToken | Written) -> Sent:
        sent = str.__new__(cls, message_id)
        sent._written = token if isinstance(token, Written) else Written(token=token)
        return sent

    @property
    def token(self) -> ConsistencyToken:
        """The message's token; :class:`TokenNotKnown` before it is written."""
        return self._written.token
