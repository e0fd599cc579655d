"""JSON text on the hot paths: what ``json.dumps`` writes, without its per-call set-up.

``json.dumps`` (and ``JSONEncoder.encode``) builds a new C encoder for every value;
:func:`make_dumps` builds one and keeps it. It does not look for circular references
(a value that holds itself ends in RecursionError, not ValueError): the values encoded
here are what cattrs unstructures messages and saga states into, which are trees.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import encoder as _encoder
from typing import Any

__all__ = ["make_dumps"]


def _not_serializable(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def make_dumps(item_separator: str = ", ", key_separator: str = ": ") -> Callable[[Any], str]:
    """``json.dumps(value, separators=(item_separator, key_separator))`` as a function."""
    make_encoder = getattr(_encoder, "c_make_encoder", None)
    if make_encoder is None:  # no C accelerator: the standard encoder, built once
        return json.JSONEncoder(separators=(item_separator, key_separator)).encode
    chunks = make_encoder(
        None,  # no circular-reference markers
        _not_serializable,
        _encoder.encode_basestring_ascii,
        None,  # no indent
        key_separator,
        item_separator,
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )

    def dumps(value: Any) -> str:
        return "".join(chunks(value, 0))

    return dumps
