"""``projections append`` (which prints the consistency token of what it appended and can
wait for consumers to apply it) and ``projections wait TOKEN CONSUMER...``.

``wait`` prints ``applied`` and exits 0 once every consumer named has applied the token.
Otherwise one error line, and an exit code a script can tell apart (``append --wait``
alike): :data:`EXIT_TIMEOUT` when not applied within the timeout, :data:`EXIT_REFUSED`
when only an operator can make it applied (a halted partition, a paused consumer, a
parked source, a skipped or rolled-back position, an unknown consumer), 1 for any other
error (a malformed token, the database). With ``--fail-fast`` it checks once and, when
not applied yet, prints what is behind and exits :data:`EXIT_NOT_YET`.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from sqlalchemy import select

from messaging import ConsistencyToken, Database, ProjectionsError, Settings, wait_for
from messaging.operations import database_for, import_module
from projections._appending import consumer_reads
from projections._cli_support import command_settings, existing_database, use_app_dir

EXIT_NOT_YET = 3
"""``wait --fail-fast``: the token is not applied yet."""
EXIT_REFUSED = 4
"""A wait refused: nothing but an operator can make the token applied."""
EXIT_TIMEOUT = 124
"""A wait timed out (as GNU ``timeout`` exits)."""


def cmd_append(args: argparse.Namespace) -> int:
    """Append the JSON lines of ``args.file``; print the count and the token; with
    ``--wait``, wait for those consumers to apply it."""
    from messaging.operations import check_consumers, registry
    from projections._appending import DeclaredTypes, append_lines, utf8_lines

    settings = command_settings(args)
    use_app_dir(args)
    for module in args.module:
        import_module(module)
    db = database_for(settings)
    tokens: list[ConsistencyToken] = []
    try:
        db.prepare()
        if args.wait:
            check_consumers(db, args.wait)  # before anything is stored
        unchecked = args.module or args.allow_unknown_type
        append = partial(
            append_lines,
            db,
            batch_size=args.batch_size,
            declared=None if unchecked else DeclaredTypes.read(db),
            registry=registry if args.module else None,
            retry=settings.messaging.consumer.conflict_retry,
            tokens=tokens,
        )
        if args.file == "-":
            buffer = getattr(sys.stdin, "buffer", None)  # none when replaced by a text stream
            count = append(sys.stdin if buffer is None else utf8_lines(buffer))
        else:
            try:
                stream = open(args.file, "rb")  # noqa: SIM115
            except OSError as exc:
                raise ProjectionsError(f"cannot read {args.file}: {exc.strerror}") from None
            with stream:
                count = append(utf8_lines(stream))
        print(f"appended {count} messages")
        token = ConsistencyToken.combine(*tokens) if tokens else ConsistencyToken(db.tenant, ())
        print(f"token {token}", flush=True)
        if args.wait:
            _wait(db, settings, token, args.wait, args.timeout, fail_fast=False)
    finally:
        db.dispose()
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    """Wait until ``args.consumers`` have applied ``args.token``."""
    settings = command_settings(args)
    db = existing_database(settings)
    try:
        return _wait(db, settings, args.token, args.consumers, args.timeout, args.fail_fast)
    finally:
        db.dispose()


def unconcerned(db: Database, token: ConsistencyToken, consumers: list[str]) -> list[str]:
    """The ``consumers`` that handle none of the token's messages (by topic and type; a
    mark naming no source counts as handled when its topic is read): their "applied"
    means nothing was theirs to apply."""
    m = db.schema.messages
    marks = token.marks
    with db.read() as conn:
        types = dict(
            conn.execute(
                select(m.c.position, m.c.type).where(
                    m.c.tenant == db.tenant, m.c.position.in_([p for _, _, p in marks])
                )
            ).all()
        )
        read = consumer_reads(db, conn, consumers)

    def handles(name: str) -> bool:
        topics, handled = read.get(name, (set(), set()))
        return any(
            topic in topics and (h is None or types.get(position) in handled)
            for topic, h, position in marks
        )

    return [name for name in consumers if not handles(name)]


def _wait(
    db: Database,
    settings: Settings,
    token: ConsistencyToken | str,
    consumers: list[str],
    timeout: float,
    fail_fast: bool,
) -> int:
    progress = wait_for(
        db,
        token,
        consumers,
        timeout=timeout,
        fail_fast=fail_fast,
        poll_interval=settings.messaging.consumer.idle_poll_interval,
    )
    if progress.applied:
        idle = unconcerned(db, ConsistencyToken.parse(str(token)), consumers)
        concerned = [name for name in consumers if name not in idle]
        if concerned:
            print(f"applied by {', '.join(concerned)}")
        for name in idle:
            print(f"{name} handles none of these messages: nothing of theirs to apply")
        return 0
    print("not applied yet:")
    for behind in progress.behind:
        print(f"  {behind}")
    return EXIT_NOT_YET
