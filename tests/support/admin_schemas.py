"""JSON Schemas of the admin routes' answers (``status --json`` is the consumers one),
strict about unknown keys, so that a test catches any change of shape."""

from __future__ import annotations

from typing import Any

import jsonschema

_ID = {"type": "string", "minLength": 1}
_INT = {"type": "integer", "minimum": 0}
_RANGES = {
    "type": "array",
    "items": {"type": "array", "items": _INT, "minItems": 2, "maxItems": 2},
}


def _object(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": sorted(required),
        "additionalProperties": False,
    }


_HALTED = {"position": _INT, "type": _ID, "error": {"type": "string"}}
_PARTITION = _object(
    {
        "partition": _INT,
        "instance": {"type": ["string", "null"]},
        "instance_id": {"type": ["string", "null"]},
        "state": {"enum": ["OWNED", "ORPHANED", "UNCLAIMED"]},
        "status": {"enum": ["running", "halted"]},
        "epoch": _INT,
        "checkpoint": _INT,
        "lag": _INT,
    },
    {
        "halted": _object(_HALTED, {"trace": {"type": ["string", "null"]}}),
        "parked_sources": {"type": "integer", "minimum": 1},
        "parked_age": {"type": "number", "minimum": 0},
        "waiting": {"type": "string"},
    },
)

CONSUMERS = _object(
    {
        "consumers": {
            "type": "array",
            "items": _object(
                {
                    "name": _ID,
                    "kind": _ID,
                    "distribution": {"enum": ["partitioned", "single-owner"]},
                    "state": {
                        "enum": [
                            "running",
                            "paused",
                            "rebuild-requested",
                            "rebuilding",
                            "cutting-over",
                            "retired",
                        ]
                    },
                    "version": {"type": "integer", "minimum": 1},
                    "partitions": {"type": "array", "items": _PARTITION},
                },
                {
                    "version_of": _ID,
                    "build": _object(
                        {
                            "applied": _INT,
                            "total": _INT,
                            "rate": {"type": "number", "minimum": 0},
                            "eta_seconds": {"type": ["number", "null"], "minimum": 0},
                        }
                    ),
                    "parked_sources": {"type": "integer", "minimum": 1},
                    "parked_age": {"type": "number", "minimum": 0},
                },
            ),
        }
    },
    {
        "in_memory": {
            "type": "array",
            "items": _object(
                {
                    "name": _ID,
                    "kind": {"const": "in-memory"},
                    "instances": {
                        "type": "array",
                        "items": _object(
                            {
                                "instance": _ID,
                                "instance_id": _ID,
                                "live": {"type": "boolean"},
                                "admin": {"type": ["string", "null"]},
                                "state": {"enum": ["running", "paused", "halted", "waiting"]},
                                "position": _INT,
                                "lag": _INT,
                            },
                            {
                                "halted": _object(_HALTED, {"trace": {"type": ["string", "null"]}}),
                                "waiting": _object(
                                    {
                                        "position": _INT,
                                        "type": _ID,
                                        "version": _INT,
                                        "reason": {"type": "string"},
                                    }
                                ),
                            },
                        ),
                    },
                }
            ),
        }
    },
)

INSTANCES = _object(
    {
        "instances": {
            "type": "array",
            "items": _object(
                {
                    "id": _ID,
                    "name": _ID,
                    "host": _ID,
                    "pid": _INT,
                    "started_at": {"type": "number"},
                    "heartbeat_at": {"type": "number"},
                    "live": {"type": "boolean"},
                    "stopping": {"type": "boolean"},
                    "last_heard": {"type": "number", "minimum": 0},
                    "late": {"type": "boolean"},
                    "gone": {"type": ["string", "null"]},
                    "reads": {
                        "type": "object",
                        "additionalProperties": {"type": "object", "additionalProperties": _INT},
                    },
                    "upcasters": {
                        "type": "object",
                        "additionalProperties": {"type": "array", "items": {"type": "string"}},
                    },
                    "applies_nothing_of": {"type": "array", "items": _ID},
                }
            ),
        }
    }
)

_MEMBER = {"id": _ID, "name": _ID, "host": _ID, "pid": _INT, "serving": {"type": "boolean"}}
_WHY = [
    "not-a-member",
    "stopping",
    "outage",
    "applies",
    "halted",
    "paused",
    "not-declared",
    "older-declaration",
    "newer-declaration",
    "waiting",
    "standby",
    "no-live-member",
    "owned-elsewhere",
]
_OR_NULL = {"type": ["string", "null"]}
CLUSTER = _object(
    {
        "answered_by": _ID,
        "serving": _object(
            {"member": {"type": "boolean"}, "id": _OR_NULL, "name": _OR_NULL, "note": _OR_NULL}
        ),
        "members": {"type": "array", "items": _object(_MEMBER)},
        "consumers": {
            "type": "array",
            "items": _object(
                {
                    "name": _ID,
                    "kind": _ID,
                    "distribution": {"enum": ["partitioned", "single-owner"]},
                    "partitioned": {"type": "boolean"},
                    "partitions": _INT,
                    "shares": {
                        "type": "array",
                        "items": _object(
                            {
                                "id": _ID,
                                "instance": _ID,
                                "partitions": {"type": "array", "items": _INT},
                                "ranges": _RANGES,
                                "share": {"type": "number", "minimum": 0, "maximum": 1},
                            }
                        ),
                    },
                    "unowned": _RANGES,
                    "here": _object(
                        {"applies": {"type": "boolean"}, "why": {"enum": _WHY}, "reason": _ID}
                    ),
                },
                {"reason": {"type": "string"}},
            ),
        },
    },
    {"no_live_member": _ID},
)

COMMAND = _object(
    {
        "consumer": _ID,
        "command": {"enum": ["pause", "resume", "rebuild", "retry", "skip", "evict", "remove"]},
    },
    {
        "halted": {"type": "array", "items": _object({"partition": _INT, **_HALTED})},
        "retrying": {"type": "array", "items": _ID},
        "retrying_skipped": _INT,
        "skipped": _object({"source": _ID, "position": _INT, "type": _ID}),
        "evicted": _INT,
        # remove
        "kind": {"type": ["string", "null"]},
        "versions": {"type": "array", "items": _INT},
        "rows": {"type": "object", "additionalProperties": _INT},
        "dropped": {"type": "array", "items": _ID},
        "kept": {"type": "array", "items": _ID},
    },
)

_PARKED_SOURCE = _object(
    {
        "source": _ID,
        "partition": _INT,
        "position": _INT,
        "count": _INT,
        "type": _ID,
        "error": {"type": ["string", "null"]},
        "trace": {"type": ["string", "null"]},
        "parked_at": {"type": "number"},
        "state": {"enum": ["parked", "retrying", "retry-skipped"]},
    }
)
_SKIPPED = _object(
    {
        "position": _INT,
        "source": _ID,
        "partition": _INT,
        "type": _ID,
        "error": {"type": ["string", "null"]},
        "skipped_at": {"type": "number"},
        "who": _ID,
    }
)
PARKED = _object(
    {"consumer": _ID, "parked": {"type": "array", "items": _PARKED_SOURCE}},
    {"skipped": {"type": "array", "items": _SKIPPED}},
)

ERROR = _object({"error": {"type": "string", "minLength": 1}})


def check(body: Any, schema: dict[str, Any]) -> Any:
    """``body`` if it matches ``schema``; a failed test naming the mismatch otherwise."""
    jsonschema.validate(body, schema)
    return body
