"""The operator commands of the command line that read or change parked sources, and the
audit log: ``projections parked``, ``retry``, ``skip``, ``evict``, ``audit``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from messaging._settings import Settings
from messaging.store._database import Database


def _settings(args: argparse.Namespace) -> Settings:
    from projections.cli import _settings as settings

    return settings(args)


def _database(args: argparse.Namespace) -> Database:
    from projections.cli import _existing_database

    db = _existing_database(_settings(args))
    try:
        db.prepare()
    except BaseException:
        db.dispose()
        raise
    return db


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def cmd_audit(args: argparse.Namespace) -> int:
    from projections._operations import audit_log

    db = _database(args)
    try:
        entries = audit_log(db, args.consumer)
    finally:
        db.dispose()
    if args.json:
        _print_json({"audit": entries})
    else:
        from projections._reports import format_time

        if entries:
            print(f"{'at':<29}  {'who':<24} {'command':<22} consumer  detail")
        for entry in entries:
            print(
                f"{format_time(entry['at']):<29}  {entry['who']:<24} {entry['command']:<22} "
                f"{entry['consumer']}  {json.dumps(entry['detail'], sort_keys=True)}"
            )
        if not entries:
            print("no operator commands recorded")
    return 0


def cmd_parked(args: argparse.Namespace) -> int:
    """List the parked sources of a consumer (and with ``--skipped`` the skipped messages)."""
    from projections._parked_ops import parked
    from projections._reports import format_time

    db = _database(args)
    try:
        report = parked(db, args.consumer, skipped=args.skipped)
    finally:
        db.dispose()
    if args.json:
        _print_json(report)
        return 0
    for entry in report["parked"]:
        print(
            f"{entry['source']}  partition {entry['partition']}  from position "
            f"{entry['position']}  {entry['count']} held  {entry['state']}  "
            f"since {format_time(entry['parked_at'])}  {entry['type']}: {entry['error']}"
        )
    if not report["parked"]:
        print(f"no parked source in {args.consumer}")
    for entry in report.get("skipped", []):
        print(
            f"skipped position {entry['position']}  {entry['source']}  {entry['type']}  "
            f"by {entry['who']} at {format_time(entry['skipped_at'])}"
        )
    return 0


def cmd_parked_operation(args: argparse.Namespace) -> int:
    """``retry``, ``skip`` or ``evict``: through the database, audited and fenced."""
    from projections import _parked_ops as ops
    from projections._operations import default_operator

    db = _database(args)
    who, consumer, source, reason = default_operator(), args.consumer, args.source, args.reason
    try:
        if args.command == "retry" and args.skipped:
            count = ops.retry_skipped(db, consumer, source=source, who=who, reason=reason)
            print(f"retrying {count} skipped messages of {source} in {consumer}")
        elif args.command == "retry":
            sources = ops.retry(db, consumer, source=source, who=who, reason=reason)
            print(f"retrying {len(sources)} parked sources of {consumer}: {', '.join(sources)}")
        elif args.command == "skip":
            skipped = ops.skip(db, consumer, source=source, who=who, reason=reason)
            print(
                f"skipped position {skipped['position']} ({skipped['type']}) of {source}; "
                "retrying the rest"
            )
        else:
            count = ops.evict(db, consumer, source=source, who=who, reason=reason)
            print(f"evicted {count} parked messages of {source} from {consumer}")
    finally:
        db.dispose()
    return 0


OPERATOR_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "audit": cmd_audit,
    "parked": cmd_parked,
    "retry": cmd_parked_operation,
    "skip": cmd_parked_operation,
    "evict": cmd_parked_operation,
}
