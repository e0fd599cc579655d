"""Derived message ids: the outbox computes uuid5 itself, and must give exactly uuid5's ids
(a retried batch after an upgrade must send the ids the first attempt sent)."""

from __future__ import annotations

import uuid

import pytest

from messaging.applying._outbox import _ID_NAMESPACE, Outbox


@pytest.mark.parametrize(
    ("sender", "cause", "count"),
    [
        ("ledger", "42", 0),
        ("transfers", "deadline\x1fk-1\x1fTransferExpired\x1f1712.5", 3),
        ("sägä ✓", "ünïcode\x1f∞", 12345),
        ("", "", 0),
    ],
)
def test_derived_ids_are_uuid5_of_sender_cause_and_count(
    sender: str, cause: str, count: int
) -> None:
    outbox = Outbox(store=None, sender=sender)  # type: ignore[arg-type]  # ids need no store
    expected = uuid.uuid5(_ID_NAMESPACE, f"{sender}\x1f{cause}\x1f{count}").hex
    assert outbox.derived_id(cause, count) == expected
    assert outbox.derived_id(cause, count) == expected  # the shared prefix hash is not consumed
