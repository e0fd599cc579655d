"""The operator commands of the command line that read or change parked sources:
``projections parked``, ``retry``, ``skip``, ``evict``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from messaging import Database
from projections._cli_support import command_settings, existing_database, print_json


def _database(args: argparse.Namespace) -> Database:
    db = existing_database(command_settings(args))
    try:
        db.prepare()
    except BaseException:
        db.dispose()
        raise
    return db


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
        print_json(report)
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
    "parked": cmd_parked,
    "retry": cmd_parked_operation,
    "skip": cmd_parked_operation,
    "evict": cmd_parked_operation,
}
