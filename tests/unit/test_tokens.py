"""Consistency tokens: their text reads back, combines, stays short, and any damage to it
is a one-line ValueError naming what is wrong."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging import ConsistencyToken, InvalidToken, Sent, TokenNotKnown, Written, wait_for
from messaging.store._rows import NewMessage, partition_hash
from messaging.store._tokens import MAX_MARKS, NOT_SENT_AGAIN, Outgoing

marks = st.lists(
    st.tuples(
        st.sampled_from(["ledger", "orders", "é/topic"]),
        st.integers(0, (1 << 32) - 1),
        st.integers(1, 1 << 40),
    ),
    max_size=200,
)


@given(marks, st.sampled_from(["default", "acme"]))
def test_a_token_reads_back_as_itself_and_keeps_each_hash_s_last_position(
    written: list[tuple[str, int, int]], tenant: str
) -> None:
    token = ConsistencyToken.of(tenant, written)
    assert ConsistencyToken.parse(str(token)) == token
    assert len(str(token)) < 4096  # fits in a cookie
    last: dict[tuple[str, int], int] = {}
    for topic, h, p in written:
        last[(topic, h)] = max(p, last.get((topic, h), 0))
    for (topic, h), position in last.items():  # every write is covered by a mark
        assert any(
            t == topic and (mh is None or mh == h) and p >= position for t, mh, p in token.marks
        )
    if len(last) <= MAX_MARKS:
        assert {(t, h): p for t, h, p in token.marks} == last


@given(marks, marks)
def test_combined_tokens_cover_both(
    a: list[tuple[str, int, int]], b: list[tuple[str, int, int]]
) -> None:
    left, right = ConsistencyToken.of("t", a), ConsistencyToken.of("t", b)
    both = left | right
    assert both == ConsistencyToken.combine(str(left), str(right))
    assert both == ConsistencyToken.of("t", [*left.marks, *right.marks])  # type: ignore[list-item]  # marks of None hash are accepted


def test_tokens_of_different_tenants_do_not_combine() -> None:
    with pytest.raises(InvalidToken, match="different tenants"):
        ConsistencyToken.of("a", [("x", 1, 1)]) | ConsistencyToken.of("b", [("x", 1, 2)])


GOOD = str(ConsistencyToken.of("default", [("ledger", 7, 42)]))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        (GOOD[:-4], "checksum does not match"),
        (GOOD[:20], "expected 3 fields"),
        (GOOD.replace("rw1", "rw2", 1), "does not start with 'rw1'"),
        (GOOD[:8] + ("A" if GOOD[8] != "A" else "B") + GOOD[9:], "checksum does not match"),
        ("rw1.!!!.a17c2e04", "checksum does not match"),
        ("x" * 10000, "longer than 8192"),
        (42, "expected a string, got int"),
    ],
)
def test_a_damaged_token_is_a_one_line_value_error_naming_what_is_wrong(
    text: object, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason) as raised:
        ConsistencyToken.parse(text)
    assert "\n" not in str(raised.value) and str(raised.value).startswith(
        "invalid consistency token"
    )


def _forged(body: str) -> str:
    """A token whose checksum matches a body built by hand."""
    import base64
    import zlib

    encoded = base64.urlsafe_b64encode(body.encode()).rstrip(b"=").decode()
    return f"rw1.{encoded}.{zlib.crc32(encoded.encode()):08x}"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("{}", r"not \[tenant, \{topic: marks\}\]"),
        ('["", {"t": [[1, 2]]}]', "tenant is not a non-empty string"),
        ('["d", {"t": []}]', "topic 't' has no marks"),
        ('["d", {"t": [[1]]}]', r"not \[hash, position\]"),
        ('["d", {"t": [[-1, 2]]}]', "partition hash -1"),
        ('["d", {"t": [[4294967296, 2]]}]', "partition hash 4294967296"),
        ('["d", {"t": [[1, 0]]}]', "position 0"),
        ('["d", {"t": [[1, true]]}]', "position True"),
        ('["d", {"t": [[1, 1.5]]}]', "position 1.5"),
        ("not json", "not base64url JSON"),
    ],
)
def test_a_forged_token_with_a_valid_checksum_is_refused_naming_the_bad_field(
    body: str, reason: str
) -> None:
    with pytest.raises(InvalidToken, match=reason):
        ConsistencyToken.parse(_forged(body))


def test_a_token_of_another_tenant_is_refused_when_asked() -> None:
    with pytest.raises(
        InvalidToken, match="issued for tenant 'default', this database serves 'acme'"
    ):
        ConsistencyToken.parse(GOOD, tenant="acme")


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"timeout": -1}, "timeout must be from 0 to 3600"),
        ({"timeout": 1e9}, "timeout must be from 0 to 3600"),
        ({"timeout": float("nan")}, "timeout must be from 0 to 3600"),
        ({"timeout": "5"}, "timeout must be a number of seconds"),
        ({"consumer": ""}, "consumer must be a non-empty name"),
        ({"consumer": []}, "consumer must be a non-empty name"),
        ({"token": "nope"}, "invalid consistency token"),
    ],
)
def test_bad_wait_arguments_are_refused_before_anything_is_read(
    kwargs: dict[str, object], reason: str
) -> None:
    arguments: dict[str, object] = {"token": GOOD, "consumer": "ledger-balances", **kwargs}
    with pytest.raises(ValueError, match=reason):
        wait_for(
            None,  # type: ignore[arg-type]  # never reached: the arguments are checked first
            arguments.pop("token"),  # type: ignore[arg-type]  # the bad values under test
            arguments.pop("consumer"),  # type: ignore[arg-type]
            **arguments,  # type: ignore[arg-type]
        )


def test_a_handler_s_token_is_known_once_written_and_says_why_before() -> None:
    """What ``ctx.append`` / ``ctx.send`` return carries no token until the batch's flush
    records the positions, and then the token of that one message; a message a replay did
    not write again says so for ever."""
    outgoing = Outgoing()
    outgoing.messages += [
        NewMessage(topic="orders", source="o-1", type="t", payload="{}"),
        NewMessage(topic="jobs", source="j-1", type="t", payload="{}"),
    ]
    appended = Written(outgoing=outgoing, index=0)
    sent = Sent("id-1", Written(outgoing=outgoing, index=1))
    for pending in (appended, sent):
        with pytest.raises(TokenNotKnown, match=r"ctx\.flush\(\)"):
            _ = pending.token
    outgoing.written("t", [42, 43])
    assert appended.token == ConsistencyToken("t", (("orders", partition_hash("o-1"), 42),))
    assert (appended.token | sent.token).positions == {
        42: ("orders", partition_hash("o-1")),
        43: ("jobs", partition_hash("j-1")),
    }
    assert sent == "id-1"
    with pytest.raises(TokenNotKnown, match="does not send or append again"):
        _ = Written(why=NOT_SENT_AGAIN).token
