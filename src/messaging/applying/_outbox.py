"""Messages a consumer sends while it applies a batch, stored only if the batch commits.

A sent message is appended to the topic named by its destination, with a ``message-id``
header. Sent from a handler, the id is derived from the sending consumer, what caused
the send (the message's position, or a deadline) and the send's order, so that a
batch applied again sends the very same ids and an idempotent receiver can tell.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from typing import Any

from messaging.store._rows import NewMessage, registered_message
from messaging.store._store import MessageStore

_ID_NAMESPACE = uuid.UUID("6f0c8a52-3a8e-4d5e-9a57-5b7d6c1e2f90")


class Outbox:
    """Builds the messages one consumer sends; the handler context appends them at commit."""

    def __init__(self, store: MessageStore, sender: str) -> None:
        self.store = store
        self.sender = sender
        self._hashed = hashlib.sha1(
            _ID_NAMESPACE.bytes + f"{sender}\x1f".encode(), usedforsecurity=False
        )
        """The SHA-1 of what every derived id's name starts with, continued per id."""

    def derived_id(self, cause: str, count: int) -> str:
        """The id of the ``count``-th message sent because of ``cause`` (stable across retries):
        ``uuid5(namespace, f"{sender}\\x1f{cause}\\x1f{count}").hex``, computed without
        building a UUID object (a batch sends thousands)."""
        digest = self._hashed.copy()
        digest.update(f"{cause}\x1f{count}".encode())
        raw = bytearray(digest.digest()[:16])
        raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
        raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
        return raw.hex()

    def event(
        self, topic: str, source: str, message: object, headers: Mapping[str, Any] | None = None
    ) -> NewMessage:
        """``message`` as the next event of ``source`` in ``topic``."""
        registry = self.store.registry
        type_name, payload = registry.encode(message)
        return registered_message(
            topic, source, type_name, payload, headers, registry.version_of(type_name)
        )
