"""The ``projections`` command line's arguments: every subcommand and its options."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn, TypeAlias

from messaging.operations import parse_duration

EXIT_USAGE = 2


def _duration(text: str) -> float:
    """An argparse type: a duration like ``30m`` (its error says what is expected)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the usage is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` (to ``high``), named in its error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"must be {span}, got {value}")
        return value

    return parse


_positive = _number(1)
_port = _number(0, 65535)


def _add_app_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--app-dir",
        default=".",
        help="folder to import the application's modules from (default: the current folder)",
    )


def _add_database_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="YAML settings file")
    parser.add_argument(
        "--database",
        help="database URL (default: $PROJECTIONS_DATABASE_URL, the config, "
        "or sqlite:///projections.db)",
    )


Commands: TypeAlias = "argparse._SubParsersAction[_Parser]"
"""What ``add_subparsers`` returns: each group of commands is added to it."""


def _add_wait_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=_wait_timeout,
        default=30.0,
        help="give up after this long: 30s (default), 500ms, 5m or seconds (2.5); at most 1h",
    )


def _wait_timeout(text: str) -> float:
    """An argparse type: a wait's timeout, a duration up to an hour."""
    from messaging.operations import check_timeout

    seconds = _duration(text)
    try:
        return check_timeout(seconds)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(
        prog="projections", description="Partitioned CQRS projections over one SQL database."
    )
    parser.add_argument(
        "--traceback", action="store_true", help="show the full traceback of an error"
    )
    parser.add_argument(
        "--log-level",
        default=None,
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="logging level (default INFO for run, admin and demo, which keep running; "
        "WARNING for the other commands, which print their result)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(commands)
    _add_reports(commands)
    _add_appends(commands)
    _add_operations(commands)
    _add_servers(commands)
    return parser


def _add_run(commands: Commands) -> None:
    """``run``: an instance, or a supervisor of several."""
    run = commands.add_parser("run", help="run an instance with the application's consumers")
    run.add_argument("modules", nargs="+", metavar="MODULE", help="application module(s)")
    run.add_argument("--instance-name", help="this instance's name (default host:pid)")
    run.add_argument(
        "--admin-port",
        type=_port,
        default=None,
        help="also serve the admin endpoints and page on this port (0: any free port)",
    )
    run.add_argument(
        "--workers",
        type=_positive,
        default=None,
        help="start a supervisor with this many instance processes (each restarted when it "
        "exits, or is stuck: see --exit-when-stuck)",
    )
    run.add_argument(
        "--exit-when-stuck",
        action="store_true",
        help="exit with code 70 once a handler is stuck past its apply-timeout by the grace "
        "(the instance not live), for a supervisor that restarts what exits (systemd; "
        "--workers passes it to its workers)",
    )
    _add_app_dir_option(run)
    _add_database_options(run)


def _add_reports(commands: Commands) -> None:
    """The reports (``status``, ``health``, ``instances``, ``messages check``) and
    ``db migrate``."""
    status = commands.add_parser("status", help="each consumer's partitions: owner, state, lag")
    status.add_argument("--json", action="store_true", help="print JSON")
    _add_database_options(status)

    health = commands.add_parser(
        "health",
        help="health verdicts; exits 0 healthy, 1 degraded, 2 critical, 3 unknown (an error)",
    )
    health.add_argument("consumer", nargs="?", help="only this consumer")
    health.add_argument("--json", action="store_true", help="print JSON")
    health.set_defaults(error_exit=3)
    _add_database_options(health)

    instances = commands.add_parser("instances", help="the registered instances")
    instances.add_argument("--json", action="store_true", help="print JSON")
    _add_database_options(instances)

    db = commands.add_parser("db", help="database schema commands")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="DB_COMMAND")
    db_migrate = db_commands.add_parser("migrate", help="apply missing schema migrations")
    _add_database_options(db_migrate)

    messages = commands.add_parser("messages", help="the stored messages' shapes")
    shapes = messages.add_subparsers(dest="messages_command", required=True, metavar="COMMAND")
    check = shapes.add_parser(
        "check",
        help="each stored (topic, type, version), its count and whether it reaches a current "
        "class through the upcasters; exits 1 if one does not",
    )
    check.add_argument(
        "modules", nargs="*", metavar="MODULE", help="modules declaring the message types"
    )
    check.add_argument("--json", action="store_true", help="print JSON")
    _add_app_dir_option(check)
    _add_database_options(check)


def _add_appends(commands: Commands) -> None:
    """``append`` and ``wait``."""
    append = commands.add_parser(
        "append", help='append JSON lines {"topic", "source", "type", "payload"}'
    )
    append.add_argument("file", nargs="?", default="-", help="input file, or - for stdin")
    append.add_argument("--batch-size", type=_positive, default=1000, help="lines per transaction")
    append.add_argument(
        "--module",
        action="append",
        default=[],
        help="import this module and check each payload against its message types",
    )
    append.add_argument(
        "--allow-unknown-type",
        action="store_true",
        help="without --module, append a type that no consumer declared in the database "
        "handles on its topic (refused by default: a likely typo)",
    )
    append.add_argument(
        "--wait",
        action="append",
        default=[],
        metavar="CONSUMER",
        help="then wait until this consumer has applied what was appended (repeatable)",
    )
    _add_wait_timeout(append)
    _add_app_dir_option(append)
    _add_database_options(append)

    wait = commands.add_parser(
        "wait", help="wait until consumers have applied a consistency token (from append)"
    )
    wait.add_argument("token", metavar="TOKEN", help="the token an append printed or returned")
    wait.add_argument("consumers", nargs="+", metavar="CONSUMER")
    wait.add_argument(
        "--fail-fast",
        action="store_true",
        help="check once: exit 3 and print what is behind when not applied yet",
    )
    _add_wait_timeout(wait)
    _add_database_options(wait)


def _add_operations(commands: Commands) -> None:
    """The operator commands: on a consumer, on its versions, on its parked sources."""
    for name, help_text in (
        ("pause", "stop every instance from applying a consumer"),
        ("resume", "let a paused consumer or its halted partitions run again"),
        ("rebuild", "build a new version of a projection beside the live one"),
        ("rollback", "make the version the live one replaced live again"),
        ("drop-version", "drop a retired version of a projection, with its tables"),
        ("forget-processed", "drop old ids from an idempotent route consumer's guard"),
        ("remove", "remove a consumer the running code no longer declares, with its rows"),
    ):
        operation = commands.add_parser(name, help=help_text)
        operation.add_argument("consumer", metavar="CONSUMER")
        operation.add_argument(
            "--reason", default="", help="recorded in the audit log with user@host"
        )
        if name == "forget-processed":
            operation.add_argument(
                "--older-than",
                required=True,
                type=_duration,
                help="ids handled longer ago than this, e.g. 168h (a week) or 30m",
            )
        if name == "drop-version":
            operation.add_argument("version", type=_positive, metavar="VERSION")
        if name == "remove":
            operation.add_argument(
                "--drop-tables",
                action="store_true",
                help="drop its read-model tables too (kept otherwise, and refused to a new "
                "declaration until dropped)",
            )
            operation.add_argument("--json", action="store_true", help="print JSON")
        if name == "resume":
            operation.add_argument(
                "--skip-poison",
                action="store_true",
                help="continue right after each halted message instead of retrying it",
            )
        _add_database_options(operation)

    versions = commands.add_parser(
        "versions", help="a projection's versions: live, building (with progress), retired"
    )
    versions.add_argument("consumer", metavar="PROJECTION")
    versions.add_argument("--json", action="store_true", help="print JSON")
    _add_database_options(versions)
    parked = commands.add_parser("parked", help="a consumer's parked sources (on-failure)")
    parked.add_argument("consumer", metavar="CONSUMER")
    parked.add_argument("--json", action="store_true", help="print JSON")
    parked.add_argument("--skipped", action="store_true", help="list the skipped messages too")
    _add_database_options(parked)
    for name, help_text in (
        ("retry", "apply a parked source's held messages (all sources without --source)"),
        ("skip", "skip a parked source's first message (recorded) and retry the rest"),
        ("evict", "drop a parked source's held messages (recorded as skipped)"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("consumer", metavar="CONSUMER")
        command.add_argument(
            "--source", required=name != "retry", help="the parked source (its stream or key)"
        )
        command.add_argument(
            "--reason", default="", help="recorded in the audit log with user@host"
        )
        if name == "retry":
            command.add_argument(
                "--skipped",
                action="store_true",
                help="apply the source's skipped messages instead, once, in their order",
            )
        _add_database_options(command)


def _add_servers(commands: Commands) -> None:
    """``audit``, ``demo`` and ``admin``."""
    audit = commands.add_parser("audit", help="the operator commands recorded, oldest first")
    audit.add_argument("consumer", nargs="?", metavar="CONSUMER")
    audit.add_argument("--json", action="store_true", help="print JSON")
    _add_database_options(audit)

    demo = commands.add_parser("demo", help="run the ledger example end to end and verify it")
    demo.add_argument(
        "--messages", type=_positive, default=20_000, help="messages of traffic to write"
    )
    demo.add_argument("--workers", type=_number(2), default=3, help="instance processes to run")
    demo.add_argument(
        "--database", default="sqlite:///projections-demo.db", help="demo database (recreated)"
    )
    demo.add_argument("--seed", type=int, default=7, help="random seed of the traffic")

    admin = commands.add_parser("admin", help="serve the reports as JSON and an HTML page")
    admin.add_argument("--port", type=_port, required=True, help="port to listen on (0: any)")
    admin.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    _add_database_options(admin)
