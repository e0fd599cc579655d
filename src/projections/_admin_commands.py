"""The operator commands of the admin server: their JSON body, checked, and what each
does through the database (:mod:`projections._operations`, versions, parked sources)."""

from __future__ import annotations

import json
from typing import Any

from messaging import Database, OperationError
from projections import _operations as operations
from projections import _parked_ops as parked_ops
from projections._removal import remove
from projections._version_commands import drop_version, rollback

_KEYS = ("reason", "skip_poison", "version", "source", "skipped", "drop_tables")


def _missing_version() -> int:
    raise OperationError("drop-version needs the 'version' to drop in its body")


def command_body(raw: bytes) -> dict[str, Any]:
    """A command's JSON body ``{"reason", "skip_poison", "version", "source", "skipped",
    "drop_tables"}`` (all optional); ValueError naming what is wrong otherwise."""
    body = json.loads(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    unknown = sorted(set(body) - set(_KEYS))
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))}; a command takes "
            f"{', '.join(map(repr, _KEYS[:-1]))} and {_KEYS[-1]!r} (the server records who "
            "asked)"
        )
    version = body.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError("'version' must be a whole number from 1")
    if not isinstance(body.get("source", ""), str):
        raise ValueError("'source' must be a string")
    if not isinstance(body.get("reason", ""), str):
        raise ValueError("'reason' must be a string")
    for flag in ("skip_poison", "skipped", "drop_tables"):
        if not isinstance(body.get(flag, False), bool):
            raise ValueError(f"{flag!r} must be true or false")
    operations.check_reason(body.get("reason", ""))
    return body


def run_command(
    db: Database,
    command: str,
    consumer: str,
    body: dict[str, Any],
    who: str,
    stale_timeout: float,
) -> dict[str, Any]:
    """Run ``command`` on ``consumer`` with its checked ``body``; what it answers
    (``stale_timeout`` tells the live instances, which some commands ask about)."""
    reason = body.get("reason", "")
    if command == "pause":
        operations.pause(db, consumer, who=who, reason=reason, stale_timeout=stale_timeout)
    elif command == "rebuild":
        operations.rebuild(db, consumer, who=who, reason=reason, stale_timeout=stale_timeout)
    elif command == "remove":
        drop = bool(body.get("drop_tables"))
        return remove(
            db, consumer, who=who, reason=reason, drop_tables=drop, stale_timeout=stale_timeout
        )
    elif command == "rollback":
        return {"version": rollback(db, consumer, who=who, reason=reason)}
    elif command == "drop-version":
        version = int(body.get("version", 0)) or _missing_version()
        tables = drop_version(db, consumer, version, who=who, reason=reason)
        return {"version": version, "tables": tables}
    elif command in ("retry", "skip", "evict"):
        source, skipped = body.get("source"), bool(body.get("skipped"))
        return parked_ops.command(db, command, consumer, source, who, reason, skipped=skipped)
    else:
        skip = bool(body.get("skip_poison"))
        halted = operations.resume(
            db, consumer, who=who, reason=reason, skip_poison=skip, stale_timeout=stale_timeout
        )
        return {"halted": halted}
    return {}
