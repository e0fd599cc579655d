"""The operator commands of the ``projections`` command line: pause, resume, rebuild,
forget-processed, remove, a projection's versions (list, rollback, drop-version) and the
audit log. Each goes through the database (:mod:`projections._operations`)."""

from __future__ import annotations

import argparse
import json

from messaging import Database, OperationError, ProjectionsError
from projections._cli_support import command_settings, existing_database, print_json, print_report
from projections._version_commands import (
    drop_version,
    format_versions,
    rollback,
    versions_report,
)


def cmd_operation(args: argparse.Namespace) -> int:
    from projections import _operations as operations
    from projections._reports import in_memory_pointer

    settings = command_settings(args)
    db = existing_database(settings)
    who = operations.default_operator()
    try:
        db.prepare()
        _operate(args, db, who, settings.messaging.consumer.stale_instance_timeout)
    except OperationError:
        skip = bool(getattr(args, "skip_poison", False))
        where = in_memory_pointer(
            db, settings.messaging.consumer, args.consumer, args.command, skip_poison=skip
        )
        if where is None:
            raise
        raise ProjectionsError(where) from None
    finally:
        db.dispose()
    return 0


def _operate(args: argparse.Namespace, db: Database, who: str, stale_timeout: float) -> None:
    """Run the operator command ``args.command`` through the database; print the outcome
    (``stale_timeout`` tells the live instances, which some commands ask about)."""
    from projections import _operations as operations

    if args.command == "pause":
        operations.pause(
            db, args.consumer, who=who, reason=args.reason, stale_timeout=stale_timeout
        )
        print(f"paused {args.consumer}")
    elif args.command == "remove":
        _remove(args, db, who, stale_timeout)
    elif args.command == "forget-processed":
        count = operations.forget_processed(
            db, args.consumer, older_than=args.older_than, who=who, reason=args.reason
        )
        print(f"forgot {count} handled message ids of {args.consumer}")
    elif args.command == "rebuild":
        operations.rebuild(
            db, args.consumer, who=who, reason=args.reason, stale_timeout=stale_timeout
        )
        print(f"rebuild of {args.consumer} requested; a running instance performs it")
    elif args.command == "rollback":
        version = rollback(db, args.consumer, who=who, reason=args.reason)
        print(
            f"rolling {args.consumer} back to version {version}: the instances running its "
            "declaration catch it up, then it takes over"
        )
    elif args.command == "drop-version":
        tables = drop_version(db, args.consumer, args.version, who=who, reason=args.reason)
        print(
            f"dropped version {args.version} of {args.consumer}: {', '.join(tables) or 'no tables'}"
        )
    else:
        halted = operations.resume(
            db,
            args.consumer,
            who=who,
            reason=args.reason,
            skip_poison=args.skip_poison,
            stale_timeout=stale_timeout,
        )
        verb = "skipped" if args.skip_poison else "retrying"
        for entry in halted:
            print(
                f"partition {entry['partition']}: {verb} position {entry['position']} "
                f"({entry['type']})"
            )
        print(f"resumed {args.consumer}")


def _remove(args: argparse.Namespace, db: Database, who: str, stale_timeout: float) -> None:
    from projections._removal import remove

    removed = remove(
        db,
        args.consumer,
        who=who,
        reason=args.reason,
        drop_tables=args.drop_tables,
        stale_timeout=stale_timeout,
    )
    if args.json:
        print_json(removed)
        return
    rows = ", ".join(f"{n} {table}" for table, n in removed["rows"].items() if n)
    print(f"removed {args.consumer}" + (f": {rows} row(s)" if rows else ""))
    if removed["dropped"]:
        print(f"dropped tables: {', '.join(removed['dropped'])}")
    if removed["kept"]:
        print(
            f"kept tables: {', '.join(removed['kept'])} (`projections remove {args.consumer} "
            "--drop-tables` drops them)"
        )


def cmd_audit(args: argparse.Namespace) -> int:
    from projections._operations import audit_log

    db = existing_database(command_settings(args))
    try:
        db.prepare(reads_only=True)
        entries = audit_log(db, args.consumer)
    finally:
        db.dispose()
    if args.json:
        print_json({"audit": entries})
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


def cmd_versions(args: argparse.Namespace) -> int:
    """``projections versions NAME``: the live, building and retired versions."""
    print_report(
        args,
        lambda db, s: versions_report(db, s.messaging.consumer, args.consumer),
        format_versions,
    )
    return 0
