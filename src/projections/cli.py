"""The ``projections`` command line: run instances, report, migrate, append, demo.

Errors exit non-zero with one clear line; ``--traceback`` shows the whole story. A
command whose output is no longer read (``projections status | head``) ends quietly
with :data:`EXIT_STDOUT_CLOSED`.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pluggy
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from messaging import (
    ConfigError,
    Instance,
    ProjectionsError,
    Settings,
    Severity,
    WaitRefused,
    WaitTimeout,
    collect_consumers,
    create_plugin_manager,
)
from messaging.operations import (
    check_overrides,
    database_for,
    import_module,
    migrate,
    parse_database_url,
    refusal,
    refusal_words,
)
from projections._cli_operations import cmd_audit, cmd_operation, cmd_versions
from projections._cli_operator import OPERATOR_COMMANDS
from projections._cli_parser import build_parser
from projections._cli_support import command_settings as _settings
from projections._cli_support import print_report as _report
from projections._cli_support import use_app_dir
from projections._cli_waits import EXIT_REFUSED, EXIT_TIMEOUT, cmd_append, cmd_wait

EXIT_ERROR = 1
EXIT_STDOUT_CLOSED = 141
"""128 + SIGPIPE: what a shell reports for a command that a closed pipe ended, as ``cat``."""


_database = database_for


def _worker_command(args: argparse.Namespace, index: int) -> list[str]:
    command = [sys.executable, "-m", "projections.cli", "--log-level", args.log_level, "run"]
    command += [*args.modules, "--app-dir", os.path.abspath(args.app_dir)]
    for option in ("config", "database"):
        if getattr(args, option):
            command += [f"--{option}", getattr(args, option)]
    command.append("--exit-when-stuck")  # not live: restarted by the supervisor
    if args.instance_name:
        command += ["--instance-name", f"{args.instance_name}-{index}"]
    if args.admin_port is not None:
        # Each worker serves its own in-memory copies: port P + 1 + index (any free port
        # when P is 0); the supervisor serves P.
        command += ["--admin-port", str(args.admin_port + 1 + index if args.admin_port else 0)]
    return command


def cmd_run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    use_app_dir(args)
    manager = create_plugin_manager([*args.modules, *settings.plugins])
    specs = collect_consumers(manager)  # fail here, once, rather than in every worker
    try:  # before any worker, admin server or database file
        check_overrides(settings, specs)
    except ConfigError as exc:
        if args.config is None:
            raise
        raise ConfigError(f"{args.config}: {exc}") from None  # as the file's other errors
    if args.workers is not None:
        if args.admin_port and args.admin_port + args.workers > 65535:
            raise ProjectionsError(
                f"--admin-port {args.admin_port} with --workers {args.workers}: the workers "
                f"serve ports {args.admin_port + 1}-{args.admin_port + args.workers}, "
                "past 65535; choose a lower port"
            )
        with _admin_alongside(args, settings, None, manager.hook):
            return _supervise(args, settings)
    db = _database(settings)
    instance = Instance(db, specs, settings, manager.hook, name=args.instance_name)
    instance.watchdog.exit_when_stuck = args.exit_when_stuck
    try:
        with _admin_alongside(args, settings, instance, manager.hook):
            instance.run()
    finally:
        db.dispose()
    return 0


@contextmanager
def _admin_alongside(
    args: argparse.Namespace,
    settings: Settings,
    instance: Instance | None,
    hooks: pluggy.HookRelay,
) -> Iterator[None]:
    """With ``--admin-port``, serve the admin endpoints from this process meanwhile (and
    operate ``instance``'s in-memory consumers through them)."""
    if args.admin_port is None:
        yield
        return
    from projections._admin import listen

    db = _database(settings)
    try:
        # Bound first, so a port in use fails before the database is made; prepared
        # before serving, so the first request finds the tables.
        server = listen(db, settings, "127.0.0.1", args.admin_port, instance, hooks)
    except BaseException:
        db.dispose()
        raise
    try:
        db.prepare()
    except BaseException:
        server.server_close()
        db.dispose()
        raise
    if instance is not None:
        host, port = server.server_address[:2]
        instance.advertise_admin(f"http://{host!s}:{port}")
    thread = threading.Thread(target=server.serve_forever, name="admin", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        db.dispose()


def _supervise(args: argparse.Namespace, settings: Settings) -> int:
    """``run --workers N``: a supervisor of N instance processes."""
    from messaging.operations import Supervisor

    db = _database(settings)
    try:
        db.prepare()  # a schema that is behind fails here, not in every restarted worker
    finally:
        db.dispose()

    timeout = settings.messaging.consumer.graceful_shutdown_timeout + 10
    supervisor = Supervisor(
        lambda index: _worker_command(args, index), args.workers, stop_timeout=timeout
    )
    return supervisor.run()


def cmd_status(args: argparse.Namespace) -> int:
    from projections._reports import consumers_report, format_consumers

    _report(args, lambda db, s: consumers_report(db, s.messaging.consumer), format_consumers)
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    """``projections health``: exits with the report's severity (0, 1 or 2)."""
    from projections._health import format_health, health_report

    report = _report(args, lambda db, s: health_report(db, s, args.consumer), format_health)
    return Severity(report["status"]).exit_code


def cmd_instances(args: argparse.Namespace) -> int:
    from projections._reports import format_instances, instances_report

    _report(args, lambda db, s: instances_report(db, s.messaging.consumer), format_instances)
    return 0


def cmd_messages(args: argparse.Namespace) -> int:
    """``projections messages check``: exits 1 when a stored shape reaches no current class."""
    from messaging.operations import registry
    from projections._shapes import format_shapes, shapes_report

    use_app_dir(args)
    for module in args.modules:
        import_module(module)
    report = _report(args, lambda db, _s: shapes_report(db, registry), format_shapes)
    return 0 if report["ok"] else EXIT_ERROR


def cmd_db(args: argparse.Namespace) -> int:
    settings = _settings(args)
    db = _database(settings, bounded=False)  # a migration may take long
    try:
        applied = migrate(db)
    finally:
        db.dispose()
    print("applied " + ", ".join(applied) if applied else "schema is up to date")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from projections._demo import run_demo

    return run_demo(
        database=args.database, messages=args.messages, workers=args.workers, seed=args.seed
    )


def cmd_admin(args: argparse.Namespace) -> int:
    from projections._admin import serve

    settings = _settings(args)
    db = _database(settings)
    try:
        db.prepare()
    except BaseException:
        db.dispose()
        raise
    hooks = create_plugin_manager(settings.plugins).hook  # GET /metrics, with a plugin
    serve(db, settings, args.host, args.port, hooks)  # disposes the engine when it stops
    return 0


_COMMANDS = {
    "run": cmd_run,
    "status": cmd_status,
    "instances": cmd_instances,
    "health": cmd_health,
    "db": cmd_db,
    "messages": cmd_messages,
    "append": cmd_append,
    "wait": cmd_wait,
    "demo": cmd_demo,
    "pause": cmd_operation,
    "forget-processed": cmd_operation,
    "resume": cmd_operation,
    "rebuild": cmd_operation,
    "rollback": cmd_operation,
    "drop-version": cmd_operation,
    "remove": cmd_operation,
    "versions": cmd_versions,
    "audit": cmd_audit,
    **OPERATOR_COMMANDS,
    "admin": cmd_admin,
}


def _reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader went away (not some other pipe)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll(), or no file behind stdout
        return False


def _stdout_closed() -> int:
    """The reader of stdout went away (``| head``): end quietly. Python flushes stdout
    again at exit, so it is pointed at /dev/null first (the Python docs' recipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_STDOUT_CLOSED


def _database_url(args: argparse.Namespace) -> URL | None:
    """The URL of the database a command used, if its settings can be read."""
    try:
        return parse_database_url(_settings(args).database)
    except Exception:
        return None


CANNOT_CONNECT = 2003
"""The MySQL client's error: no server answers at the address."""


def _database_reason(exc: DBAPIError, url: URL | None) -> str:
    """The driver's first line; a MySQL error as its message and code, and a failed
    connection with the server's address (the driver names the host alone)."""
    if exc.orig is None:
        return str(exc).splitlines()[0]
    args = exc.orig.args
    if len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], str):  # PyMySQL
        code, message = args
        if code == CANNOT_CONNECT and url is not None and url.host:
            message = f"{message} at {url.host}:{url.port or 3306}"
        return f"{message.splitlines()[0]} (MySQL error {code})"
    return (str(exc.orig).splitlines() or [""])[0]


LOGGING_COMMANDS = ("run", "admin", "demo")
"""The commands that keep running, and log at INFO by default; the others print their
result and log only warnings, unless ``--log-level`` says otherwise."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``projections`` console script."""
    args = build_parser().parse_args(argv)
    if args.log_level is None:
        args.log_level = "INFO" if args.command in LOGGING_COMMANDS else "WARNING"
    failed = getattr(args, "error_exit", EXIT_ERROR)  # `health`: 3, apart from its verdicts
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code = _COMMANDS[args.command](args)
        sys.stdout.flush()  # a reader gone shows here at the latest, not at exit
        return code
    except ProjectionsError as exc:
        if args.traceback:
            raise
        print(f"projections: error: {exc}", file=sys.stderr)
        if isinstance(exc, WaitTimeout):
            return EXIT_TIMEOUT
        return EXIT_REFUSED if isinstance(exc, WaitRefused) else failed
    except DBAPIError as exc:
        if args.traceback:
            raise
        reason = _database_reason(exc, _database_url(args))
        kind = refusal(exc)
        if kind is not None:  # in words a user acts on, naming the file or server
            reason = f"refuses writes: {refusal_words(kind, _database_url(args))} ({reason})"
        print(f"projections: error: database: {reason}", file=sys.stderr)
        return failed
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug or an unforeseen failure: still one line
        if isinstance(exc, BrokenPipeError) and _reader_gone():
            return _stdout_closed()
        if args.traceback:
            raise
        first = (str(exc).splitlines() or [""])[0]
        print(
            f"projections: error: {type(exc).__name__}: {first} (--traceback shows where)",
            file=sys.stderr,
        )
        return failed


if __name__ == "__main__":
    sys.exit(main())
