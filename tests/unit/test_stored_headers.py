"""Stored headers: the text an append writes is what ``json.dumps`` writes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from messaging._messages import MESSAGE_ID_HEADER
from messaging.store._rows import headers_json


@given(st.text(min_size=1, max_size=60))
def test_a_lone_message_id_is_stored_as_json_dumps_writes_it(message_id: str) -> None:
    headers = {MESSAGE_ID_HEADER: message_id}
    assert headers_json(headers) == json.dumps(headers)
    assert json.loads(headers_json(headers) or "") == headers


@given(st.dictionaries(st.text(max_size=10), st.text(max_size=10) | st.integers()))
def test_any_headers_are_stored_as_json_dumps_writes_them(headers: dict[str, object]) -> None:
    assert headers_json(headers) == (json.dumps(headers) if headers else None)


def test_plain_and_escaped_ids() -> None:
    assert headers_json({MESSAGE_ID_HEADER: "ab-12"}) == '{"message-id": "ab-12"}'
    assert headers_json({MESSAGE_ID_HEADER: 'a"b'}) == '{"message-id": "a\\"b"}'
    assert headers_json({MESSAGE_ID_HEADER: "é"}) == '{"message-id": "\\u00e9"}'
    assert headers_json(None) is None and headers_json({}) is None
