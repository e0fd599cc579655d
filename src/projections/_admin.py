"""The admin server: the reports as JSON over HTTP, a small HTML page, and the operator
commands.

Routes:

- ``GET /admin/consumers``: :func:`projections._reports.consumers_report`;
- ``GET /admin/instances``: :func:`projections._reports.instances_report`;
- ``GET /admin/cluster``: the live members and how each consumer's partitions are shared
  among them (:func:`cluster_report`), plus ``answered_by``, this server's host:pid;
- ``GET /admin/cluster`` also marks the serving member and says, per consumer, whether
  the serving instance applies it and why not (:mod:`projections._cluster`);
- ``GET /admin``: the HTML page (``admin_page.html``), refreshed every 2 s, with buttons;
- ``GET /metrics``: the metrics in the Prometheus text format, from the plugins
  (``projections_metrics_exposition``: ``projections_otel``); 404 saying how to enable
  them without one;
- ``GET /admin/health``: the health verdicts (:func:`projections._health.health_report`),
  ``GET /admin/consumers/<name>/health`` one consumer's (404 for an unknown one);
- ``GET /admin/health/live`` and ``/admin/health/ready``: 200 or 503 with the reasons
  (:mod:`messaging.runtime._probes`), for load balancers and Kubernetes probes;
- ``GET /admin/consumers/<name>/versions``: a projection's versions
  (:func:`projections._version_commands.versions_report`);
- ``GET /admin/consumers/<name>/parked``: its parked sources and skipped messages
  (:func:`projections._parked_ops.parked`);
- ``GET /admin/consumers/<name>/wait?token=&timeout=``: a long poll until the consumer has
  applied a consistency token (a read; :mod:`projections._admin_waits`);
- ``GET /admin/consumers/<name>/progress``: its checkpoints as server-sent events
  (:mod:`projections._admin_progress`);
- ``POST /admin/consumers/<name>/<command>`` (:data:`COMMANDS`): the commands, with an
  optional JSON body ``{"reason", "skip_poison", "version", "source", "skipped",
  "drop_tables"}`` (``version``: the one ``drop-version`` drops; ``source``: which parked
  source to retry, skip or evict; ``skipped``: retry its skipped messages;
  ``drop_tables``: ``remove`` drops the tables too); the audit records
  ``admin token@<peer address>``.

Every request must name this server in its ``Host`` header (421 otherwise); the GETs,
``/metrics`` included, are read-only and need no token (like the reports); commands need
the admin token, a JSON content type and no foreign ``Origin`` (:mod:`projections._admin_guard`).
Paths are URL-decoded. Errors are ``{"error": "..."}``: 404 unknown route, 409 a command
that does not fit, 503 while the database fails (its error goes to the log only). Each
request reads in its own short transaction (the reports open one).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from functools import partial
from importlib import resources
from typing import Any
from urllib.parse import unquote

import pluggy
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from messaging import Database, Instance, OperationError, ProjectionsError, Settings, Unanswered
from messaging.operations import (
    POLL,
    DatabaseCheck,
    Refreshed,
    StopSignals,
    liveness,
    lock_wait_bound,
    readiness,
)
from projections import _parked_ops as parked_ops
from projections._admin_commands import command_body, run_command
from projections._admin_guard import AdminGuard, Refusal, require_token_off_loopback
from projections._admin_http import BoundedHTTPServer, LimitedRequestHandler
from projections._admin_progress import serve as serve_progress
from projections._admin_waits import Answer, wait_answer
from projections._cluster import Here, cluster_report
from projections._health import UnknownConsumer, health_report
from projections._reports import (
    consumers_report,
    in_memory_pointer,
    instances_report,
)
from projections._version_commands import versions_report

log = logging.getLogger("projections.admin")
LONG_REQUESTS = "waits and progress streams"
"""What takes the admin server's slots for long requests (at most half its threads)."""

DATABASE_UNAVAILABLE = "the database is unavailable; see the server's log"
NO_METRICS = (
    "no metrics here: enable the OpenTelemetry plugin (plugins: [projections_otel] in the "
    "config; pip install 'projections[otel]') and restart"
)
NO_EXPORTER = (
    "no metrics here: the metrics plugin is enabled, but the Prometheus exporter it needs "
    "is not installed: pip install 'projections[otel]' and restart"
)
COMMANDS = (
    "pause",
    "resume",
    "rebuild",
    "rollback",
    "drop-version",
    "remove",
    "retry",
    "skip",
    "evict",
)
IN_MEMORY = ("pause", "resume", "rebuild")  # what an in-memory copy takes (no versions)
#: Seconds a client has to send a whole request; handler threads; bytes of a command's body.
REQUEST_TIMEOUT = 10.0
MAX_THREADS = 16
MAX_BODY_BYTES = 16 * 1024
#: The page runs only its own script, talks only to this server and is never framed.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
}


def identity() -> str:
    """This process as ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        text = str(exc.orig)
    else:
        text = str(exc) or type(exc).__name__
    lines = text.strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _page() -> bytes:
    return resources.files("projections").joinpath("admin_page.html").read_bytes()


def _segments(target: str) -> list[str] | None:
    """The request target's path as URL-decoded segments; None if one is not UTF-8."""
    path = target.split("?", 1)[0]
    try:
        return [unquote(part, errors="strict") for part in path.split("/") if part]
    except UnicodeDecodeError:
        return None


VERDICTS_EVERY = 2.0
"""Seconds between the reads of the health verdicts that ``/metrics`` shows, while it is
scraped (a scrape answers from memory: Prometheus' scrape timeout is 10 s by default)."""


class Admin:
    """What the admin server answers, apart from HTTP: the reports, the probes, the metrics
    and the commands, for one database (beside an ``instance``, if given)."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        instance: Instance | None,
        hooks: pluggy.HookRelay | None,
    ) -> None:
        self.db, self.settings, self.instance = db, settings, instance
        self.hooks = hooks if hooks is not None or instance is None else instance.hooks
        self.me = identity()
        self.page = _page()
        consumers = settings.messaging.consumer
        silent_after = lock_wait_bound(consumers.stale_instance_timeout)
        self.database_check = DatabaseCheck(db, silent_after)
        self._verdicts = Refreshed(
            partial(verdicts, db, settings), name="health-verdicts", interval=VERDICTS_EVERY
        )
        self._silent_after = silent_after
        self.reports: dict[str, Callable[[], dict[str, Any]]] = {
            "/admin/consumers": lambda: consumers_report(db, consumers),
            "/admin/instances": lambda: instances_report(db, consumers),
            "/admin/cluster": lambda: cluster_report(
                consumers_report(db, consumers),
                instances_report(db, consumers),
                self.me,
                Here.of(instance) if instance is not None else None,
            ),
            "/admin/health": lambda: health_report(db, settings),
        }
        self.probes: dict[str, Callable[[], list[str]]] = {
            "/admin/health/live": lambda: liveness(instance),
            "/admin/health/ready": lambda: readiness(instance, self.database_check),
        }

    def consumer_report(self, name: str, what: str) -> Callable[[], dict[str, Any]] | None:
        """The report ``GET /admin/consumers/<name>/<what>`` answers (health, versions,
        parked), or None for another ``what``."""
        db, settings = self.db, self.settings
        reports: dict[str, Callable[[], dict[str, Any]]] = {
            "health": lambda: health_report(db, settings, name),
            "versions": lambda: versions_report(db, settings.messaging.consumer, name),
            "parked": lambda: parked_ops.parked(db, name, skipped=True),
        }
        return reports.get(what)

    def verdicts(self) -> Mapping[str, str]:
        """Each consumer's health verdict as last read (the metrics' health source): from
        memory, refreshed every :data:`VERDICTS_EVERY` seconds while scraped; an error
        rather than old verdicts while the database does not answer."""
        reading = self._verdicts.get()
        if reading.waiting > self._silent_after:
            raise ProjectionsError(f"the database has not answered for {reading.waiting:.1f} s")
        if reading.error is not None:
            raise reading.error
        if reading.value is None:
            raise ProjectionsError("the database has not answered yet")
        return reading.value

    def exports_metrics(self) -> bool:
        """Whether a plugin that exposes metrics is enabled (it may lack its exporter)."""
        hooks = self.hooks
        return hooks is not None and bool(hooks.projections_metrics_exposition.get_hookimpls())

    def metrics(self) -> tuple[bytes, str] | None:
        """The metrics in the Prometheus text format and their content type, from the
        plugins; None without one that exposes them."""
        return None if self.hooks is None else self.hooks.projections_metrics_exposition()

    def command(
        self, consumer: str, command: str, body: dict[str, Any], peer: tuple[str, int]
    ) -> dict[str, Any]:
        """Run the operator's ``command`` on ``consumer`` (this instance's copy, for an
        in-memory consumer it runs), audited as the admin token's from ``peer``."""
        host, port = peer
        skip = bool(body.get("skip_poison"))
        instance = self.instance
        if instance is not None and consumer in instance.in_memory and command in IN_MEMORY:
            result = instance.operate_in_memory(consumer, command, skip_poison=skip)
        else:
            result = {"consumer": consumer, "command": command}
            try:
                who = f"admin token@{host}"
                stale = self.settings.messaging.consumer.stale_instance_timeout
                result.update(run_command(self.db, command, consumer, body, who, stale))
            except OperationError:
                consumers = self.settings.messaging.consumer
                where = in_memory_pointer(self.db, consumers, consumer, command, skip_poison=skip)
                if where is None:
                    raise
                raise OperationError(where) from None
        log.info("admin: %s %s by %s:%s", command, consumer, host, port)
        return result


class AdminServer(BoundedHTTPServer):
    """The admin HTTP server: its requests are answered from :attr:`admin`, and checked by
    :attr:`guard` (made for the address it is bound to)."""

    def __init__(
        self, address: tuple[str, int], admin: Admin, *, max_threads: int, request_timeout: float
    ) -> None:
        self.admin = admin
        super().__init__(
            address, AdminHandler, max_threads=max_threads, request_timeout=request_timeout
        )
        host, port = self.server_address[:2]
        try:
            require_token_off_loopback(str(host), admin.settings.admin.token)
        except ProjectionsError:
            self.server_close()
            raise
        token, allowed = admin.settings.admin.token, admin.settings.admin.allowed_hosts
        self.guard = AdminGuard(token, allowed, str(host), int(port))


class AdminHandler(LimitedRequestHandler):
    """One request to an :class:`AdminServer` (see the module for the routes)."""

    server: AdminServer
    server_version = "projections-admin"

    def _refuse(self, refusal: Refusal) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else None
        self.send_json(refusal.status, {"error": refusal.error}, headers=headers)

    def _host_refused(self) -> bool:
        refusal = self.server.guard.check_host(self.headers.get_all("Host") or [])
        if refusal is not None:
            self._refuse(refusal)
        return refusal is not None

    def _answer(self, what: str, work: Callable[[], dict[str, Any] | Answer | None]) -> None:
        """Answer ``work()`` (a body, a status and body, or None: no answer, the client
        is gone): 409 for a refused command, 503 while the database fails, 500 for
        anything else (details in the log, never in the answer)."""
        try:
            data = work()
        except OperationError as exc:
            self.send_json(409, {"error": str(exc)})
        except UnknownConsumer as exc:
            self.send_json(404, {"error": str(exc)})
        except (DBAPIError, PoolTimeout, Unanswered) as exc:  # PoolTimeout: all busy
            log.warning("admin %s: database unavailable: %s", what, _one_line(exc))
            self.send_json(503, {"error": DATABASE_UNAVAILABLE})
        except Exception:
            log.exception("admin %s failed", what)
            self.send_json(500, {"error": "internal error; see the server's log"})
        else:
            if data is None:
                self.close_connection = True
            elif isinstance(data, tuple):
                self.send_json(*data)
            else:
                self.send_json(200, data)

    def do_GET(self) -> None:
        if self._host_refused():
            return
        segments = _segments(self.path)
        if segments is None:
            self.send_error(400, "bad request: the path is not UTF-8")
            return
        path, admin = "/" + "/".join(segments), self.server.admin
        if path == "/admin":
            self.send_body(200, admin.page, "text/html; charset=utf-8", headers=PAGE_HEADERS)
        elif path == "/metrics":
            self._metrics()
        elif path in admin.probes:
            reasons = admin.probes[path]()
            body = {"status": "fail" if reasons else "ok", "reasons": reasons, "by": admin.me}
            self.send_json(503 if reasons else 200, body)
        elif len(segments) == 4 and segments[:2] == ["admin", "consumers"]:
            self._consumer_get(path, segments[2], segments[3])
        elif path in admin.reports:
            self._answer(path, admin.reports[path])
        else:
            self.send_json(404, {"error": f"no such route: {path}"})

    def _metrics(self) -> None:
        admin = self.server.admin
        exposed = admin.metrics()
        if exposed is None:
            self.send_json(404, {"error": NO_EXPORTER if admin.exports_metrics() else NO_METRICS})
        else:
            self.send_body(200, *exposed)

    def _consumer_get(self, path: str, name: str, what: str) -> None:
        """``GET /admin/consumers/<name>/<what>``: a long wait or progress stream, or a
        report of the consumer."""
        admin = self.server.admin
        consumers = admin.settings.messaging.consumer
        if what in ("wait", "progress"):
            with self.long_request(LONG_REQUESTS) as admitted:
                if not admitted:
                    return
                if what == "progress":
                    serve_progress(self, admin.db, consumers, name)
                    return
                sock, target = self.connection, self.path
                self._answer(path, lambda: wait_answer(admin.db, consumers, name, target, sock))
            return
        report = admin.consumer_report(name, what)
        if report is None:
            self.send_json(404, {"error": f"no such route: {path}"})
        else:
            self._answer(path, report)

    def do_POST(self) -> None:
        """``POST /admin/consumers/<name>/<command>`` (:data:`COMMANDS`): the commands
        (see :func:`projections._admin_guard.AdminGuard.check_command` for who may)."""
        if self._host_refused():
            return
        segments = _segments(self.path)
        if (
            segments is None
            or len(segments) != 4
            or segments[:2] != ["admin", "consumers"]
            or segments[3] not in COMMANDS
        ):
            self.send_json(404, {"error": "no such route: POST " + self.path.split("?")[0]})
            return
        refusal = self.server.guard.check_command(
            authorization=self.headers.get("Authorization"),
            origin=self.headers.get("Origin"),
            content_type=self.headers.get("Content-Type"),
            host=self.headers.get("Host") or "",
        )
        if refusal is not None:
            self._refuse(refusal)
            return
        raw = self.read_body(MAX_BODY_BYTES)
        if raw is None:
            return
        try:
            body = command_body(raw)
        except ValueError as exc:  # JSONDecodeError and OperationError included
            self.send_error(400, f"bad request: {exc}")
            return
        consumer, command = segments[2], segments[3]
        peer = (str(self.client_address[0]), int(self.client_address[1]))
        run = partial(self.server.admin.command, consumer, command, body, peer)
        self._answer(f"POST {command}", run)


def make_server(
    db: Database,
    settings: Settings,
    host: str,
    port: int,
    *,
    request_timeout: float = REQUEST_TIMEOUT,
    max_threads: int = MAX_THREADS,
    instance: Instance | None = None,
    hooks: pluggy.HookRelay | None = None,
) -> AdminServer:
    """A (not yet serving) admin server on ``host:port``; port 0 picks a free one.

    Commands need ``settings.admin.token``; without one, a server on an address other
    hosts can reach is refused with :class:`ProjectionsError` (so is a port in use).
    ``request_timeout`` and ``max_threads`` bound what clients can hold (see
    :mod:`projections._admin_http`). Served beside an ``instance``, the commands for its
    in-memory consumers act on its copy. ``hooks`` (the instance's by default) are told
    the server started, with a health source (``projections_admin_started``), and give
    ``GET /metrics`` (``projections_metrics_exposition``).
    """
    admin = Admin(db, settings, instance, hooks)
    server = AdminServer(
        (host, port), admin, max_threads=max_threads, request_timeout=request_timeout
    )
    if admin.hooks is not None:
        instance_id = instance.id if instance is not None else None
        admin.hooks.projections_admin_started(
            tenant=db.tenant, instance_id=instance_id, health=admin.verdicts
        )
    return server


def verdicts(db: Database, settings: Settings) -> Mapping[str, str]:
    """Each consumer's health verdict now (the metrics' health source)."""
    return {c["name"]: str(c["verdict"]) for c in health_report(db, settings)["consumers"]}


def listen(
    db: Database,
    settings: Settings,
    host: str,
    port: int,
    instance: Instance | None = None,
    hooks: pluggy.HookRelay | None = None,
) -> AdminServer:
    """:func:`make_server` (beside ``instance``, if given), with a port that cannot be bound
    as a :class:`ProjectionsError`; prints the page's address."""
    try:
        server = make_server(db, settings, host, port, instance=instance, hooks=hooks)
    except OSError as exc:
        raise ProjectionsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound_host, bound_port = (str(part) for part in server.server_address[:2])
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"admin page: http://{shown}:{bound_port}/admin", flush=True)
    if settings.admin.token is None:
        print("admin commands are disabled: no admin token is configured", flush=True)
    return server


def serve(
    db: Database, settings: Settings, host: str, port: int, hooks: pluggy.HookRelay | None = None
) -> None:
    """Serve until SIGINT or SIGTERM, then close the server and dispose the engine."""
    try:
        server = listen(db, settings, host, port, hooks=hooks)
    except BaseException:
        db.dispose()
        raise

    serving = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="admin", daemon=True
    )
    try:
        with StopSignals() as signals:
            serving.start()
            while signals.received is None and serving.is_alive():
                serving.join(POLL)
            log.info("admin: %s received; stopping", signals.received)
            server.shutdown()
    finally:
        server.server_close()
        db.dispose()
