"""The message type of the poison tests, shared by the modules that append it."""

from __future__ import annotations

import attrs

from messaging import message


@message("test.poison.item")
@attrs.define(frozen=True)
class Item:
    name: str
