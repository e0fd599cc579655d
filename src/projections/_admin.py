"""The admin server: the reports as JSON over HTTP, a small HTML page, and the operator
commands.

Routes:

- ``GET /admin/consumers``: :func:`projections._reports.consumers_report`;
- ``GET /admin/instances``: :func:`projections._reports.instances_report`;
- ``GET /admin/cluster``: the live members and how each consumer's partitions are shared
  among them (:func:`cluster_report`), plus ``answered_by``, this server's host:pid;
- ``GET /admin``: the HTML page (``admin_page.html``), refreshed every 2 s, with buttons;
- ``GET /admin/health``: the health verdicts (:func:`projections._health.health_report`),
  ``GET /admin/consumers/<name>/health`` one consumer's (404 for an unknown one);
- ``GET /admin/health/live`` and ``/admin/health/ready``: 200 or 503 with the reasons
  (:mod:`messaging.runtime._probes`), for load balancers and Kubernetes probes;
- ``GET /admin/consumers/<name>/versions``: a projection's versions
  (:func:`projections._version_commands.versions_report`);
- ``POST /admin/consumers/<name>/<pause|resume|rebuild|rollback|drop-version>``: the
  commands, with an optional JSON body ``{"reason", "skip_poison", "version"}``
  (``version``: the one ``drop-version`` drops); the audit records
  ``admin token@<peer address>``.

Every request must name this server in its ``Host`` header (421 otherwise); commands need
the admin token, a JSON content type and no foreign ``Origin`` (:mod:`projections._admin_guard`).
Paths are URL-decoded. Errors are ``{"error": "..."}``: 404 unknown route, 409 a command
that does not fit, 503 while the database fails (its error goes to the log only). Each
request reads in its own short transaction (the reports open one).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterable
from importlib import resources
from types import FrameType
from typing import Any
from urllib.parse import unquote

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from messaging._errors import OperationError, ProjectionsError, Unanswered
from messaging._settings import Distribution, Settings
from messaging._states import OwnerState
from messaging.runtime._instance import Instance
from messaging.runtime._probes import liveness, readiness
from messaging.store._database import Database
from projections import _operations as operations
from projections._admin_guard import AdminGuard, Refusal, require_token_off_loopback
from projections._admin_http import BoundedHTTPServer, LimitedRequestHandler
from projections._health import UnknownConsumer, health_report
from projections._reports import (
    consumers_report,
    in_memory_pointer,
    instances_report,
)
from projections._version_commands import drop_version, rollback, versions_report

log = logging.getLogger("projections.admin")

SINGLE_OWNER_REASON = "single-owner: one elected instance applies it"
DATABASE_UNAVAILABLE = "the database is unavailable; see the server's log"
COMMANDS = ("pause", "resume", "rebuild", "rollback", "drop-version")
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


def ranges(numbers: Iterable[int]) -> list[list[int]]:
    """Numbers as sorted contiguous inclusive ranges: ``[0,1,2,5]`` → ``[[0,2],[5,5]]``."""
    result: list[list[int]] = []
    for n in sorted(set(numbers)):
        if result and result[-1][1] == n - 1:
            result[-1][1] = n
        else:
            result.append([n, n])
    return result


def cluster_report(
    consumers: dict[str, Any], instances: dict[str, Any], answered_by: str
) -> dict[str, Any]:
    """Live members (sorted by id) and, per consumer, each member's share of its partitions.

    ``consumers`` and ``instances`` are the two reports of :mod:`projections._reports`.
    A partition counts for a member only while it is OWNED by it; the others are listed
    under ``unowned`` (ORPHANED or UNCLAIMED). ``share`` is the member's count over the
    consumer's partition count (0 when it has none).
    """
    members = sorted(
        (
            {"id": i["id"], "name": i["name"], "host": i["host"], "pid": i["pid"]}
            for i in instances["instances"]
            if i["live"]
        ),
        key=lambda m: str(m["id"]),
    )
    result = []
    for consumer in consumers["consumers"]:
        parts = consumer["partitions"]
        total = len(parts)
        owned: dict[str, list[int]] = {m["id"]: [] for m in members}
        unowned: list[int] = []
        for p in parts:
            if p["state"] == OwnerState.OWNED and p.get("instance_id") in owned:
                owned[p["instance_id"]].append(p["partition"])
            else:
                unowned.append(p["partition"])
        partitioned = consumer["distribution"] == Distribution.PARTITIONED.value
        entry: dict[str, Any] = {
            "name": consumer["name"],
            "kind": consumer["kind"],
            "distribution": consumer["distribution"],
            "partitioned": partitioned,
            "partitions": total,
            "shares": [
                {
                    "id": m["id"],
                    "instance": m["name"],
                    "partitions": sorted(owned[m["id"]]),
                    "ranges": ranges(owned[m["id"]]),
                    "share": len(owned[m["id"]]) / total if total else 0.0,
                }
                for m in members
            ],
            "unowned": ranges(unowned),
        }
        if not partitioned:
            entry["reason"] = SINGLE_OWNER_REASON
        result.append(entry)
    return {"answered_by": answered_by, "members": members, "consumers": result}


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


def _missing_version() -> int:
    raise OperationError("drop-version needs the 'version' to drop in its body")


def _command_body(raw: bytes) -> dict[str, Any]:
    """A command's JSON body ``{"reason", "skip_poison", "version"}`` (all optional);
    ValueError naming what is wrong otherwise."""
    body = json.loads(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    unknown = sorted(set(body) - {"reason", "skip_poison", "version"})
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))}; a command takes "
            "'reason', 'skip_poison' and 'version' (the server records who asked)"
        )
    version = body.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError("'version' must be a whole number from 1")
    if not isinstance(body.get("reason", ""), str):
        raise ValueError("'reason' must be a string")
    if not isinstance(body.get("skip_poison", False), bool):
        raise ValueError("'skip_poison' must be true or false")
    operations.check_reason(body.get("reason", ""))
    return body


def make_server(
    db: Database,
    settings: Settings,
    host: str,
    port: int,
    *,
    request_timeout: float = REQUEST_TIMEOUT,
    max_threads: int = MAX_THREADS,
    instance: Instance | None = None,
) -> BoundedHTTPServer:
    """A (not yet serving) admin server on ``host:port``; port 0 picks a free one.

    Commands need ``settings.admin.token``; without one, a server on an address other
    hosts can reach is refused with :class:`ProjectionsError` (so is a port in use).
    ``request_timeout`` and ``max_threads`` bound what clients can hold (see
    :mod:`projections._admin_http`). Served beside an ``instance``, the commands for its
    in-memory consumers act on its copy.
    """
    admin = settings.admin
    consumer_settings = settings.messaging.consumer
    me = identity()
    page = _page()
    routes: dict[str, Callable[[], dict[str, Any]]] = {
        "/admin/consumers": lambda: consumers_report(db, consumer_settings),
        "/admin/instances": lambda: instances_report(db, consumer_settings),
        "/admin/cluster": lambda: cluster_report(
            consumers_report(db, consumer_settings),
            instances_report(db, consumer_settings),
            me,
        ),
        "/admin/health": lambda: health_report(db, settings),
    }
    probes: dict[str, Callable[[], list[str]]] = {
        "/admin/health/live": lambda: liveness(instance),
        "/admin/health/ready": lambda: readiness(instance, db),
    }

    class Handler(LimitedRequestHandler):
        server_version = "projections-admin"

        def _refuse(self, refusal: Refusal) -> None:
            headers = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else None
            self.send_json(refusal.status, {"error": refusal.error}, headers=headers)

        def _host_refused(self) -> bool:
            refusal = guard.check_host(self.headers.get_all("Host") or [])
            if refusal is not None:
                self._refuse(refusal)
            return refusal is not None

        def _answer(self, what: str, work: Callable[[], dict[str, Any]]) -> None:
            """Answer ``work()``: 409 for a refused command, 503 while the database fails,
            500 for anything else (details in the log, never in the answer)."""
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
                self.send_json(200, data)

        def do_GET(self) -> None:
            if self._host_refused():
                return
            segments = _segments(self.path)
            if segments is None:
                self.send_error(400, "bad request: the path is not UTF-8")
                return
            path = "/" + "/".join(segments)
            if path == "/admin":
                self.send_body(200, page, "text/html; charset=utf-8", headers=PAGE_HEADERS)
                return
            probe = probes.get(path)
            if probe is not None:
                reasons = probe()
                body = {"status": "fail" if reasons else "ok", "reasons": reasons, "by": me}
                self.send_json(503 if reasons else 200, body)
                return
            if segments[:2] == ["admin", "consumers"] and segments[3:] == ["health"]:
                name = segments[2]
                self._answer(path, lambda: health_report(db, settings, name))
                return
            if segments[:2] == ["admin", "consumers"] and segments[3:] == ["versions"]:
                name = segments[2]
                self._answer(path, lambda: versions_report(db, consumer_settings, name))
                return
            route = routes.get(path)
            if route is None:
                self.send_json(404, {"error": f"no such route: {path}"})
                return
            self._answer(path, route)

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
            refusal = guard.check_command(
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
                body = _command_body(raw)
            except ValueError as exc:  # JSONDecodeError and OperationError included
                self.send_error(400, f"bad request: {exc}")
                return
            consumer, command = segments[2], segments[3]
            peer_host, peer_port = self.client_address[:2]
            who = f"admin token@{peer_host}"
            reason = body.get("reason", "")
            skip = bool(body.get("skip_poison"))

            def through_database() -> dict[str, Any]:
                if command == "pause":
                    operations.pause(db, consumer, who=who, reason=reason)
                elif command == "rebuild":
                    operations.rebuild(db, consumer, who=who, reason=reason)
                elif command == "rollback":
                    return {"version": rollback(db, consumer, who=who, reason=reason)}
                elif command == "drop-version":
                    version = int(body.get("version", 0)) or _missing_version()
                    tables = drop_version(db, consumer, version, who=who, reason=reason)
                    return {"version": version, "tables": tables}
                else:
                    halted = operations.resume(
                        db,
                        consumer,
                        who=who,
                        reason=reason,
                        skip_poison=skip,
                    )
                    return {"halted": halted}
                return {}

            def run() -> dict[str, Any]:
                result: dict[str, Any] = {"consumer": consumer, "command": command}
                if instance is not None and consumer in instance.in_memory and command in IN_MEMORY:
                    result = instance.operate_in_memory(consumer, command, skip_poison=skip)
                else:
                    try:
                        result.update(through_database())
                    except OperationError:
                        where = in_memory_pointer(
                            db, consumer_settings, consumer, command, skip_poison=skip
                        )
                        if where is None:
                            raise
                        raise OperationError(where) from None
                log.info("admin: %s %s by %s:%s", command, consumer, peer_host, peer_port)
                return result

            self._answer(f"POST {command}", run)

    server = BoundedHTTPServer(
        (host, port), Handler, max_threads=max_threads, request_timeout=request_timeout
    )
    bound_host, bound_port = server.server_address[:2]
    try:
        require_token_off_loopback(str(bound_host), admin.token)
    except ProjectionsError:
        server.server_close()
        raise
    guard = AdminGuard(admin.token, admin.allowed_hosts, str(bound_host), int(bound_port))
    return server


def listen(
    db: Database, settings: Settings, host: str, port: int, instance: Instance | None = None
) -> BoundedHTTPServer:
    """:func:`make_server` (beside ``instance``, if given), with a port that cannot be bound
    as a :class:`ProjectionsError`; prints the page's address."""
    try:
        server = make_server(db, settings, host, port, instance=instance)
    except OSError as exc:
        raise ProjectionsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound_host, bound_port = (str(part) for part in server.server_address[:2])
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"admin page: http://{shown}:{bound_port}/admin", flush=True)
    if settings.admin.token is None:
        print("admin commands are disabled: no admin token is configured", flush=True)
    return server


def serve(db: Database, settings: Settings, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM, then close the server and dispose the engine."""
    try:
        server = listen(db, settings, host, port)
    except BaseException:
        db.dispose()
        raise

    def stop(signum: int, frame: FrameType | None) -> None:
        log.info("admin: %s received; stopping", signal.Signals(signum).name)
        # shutdown() waits for serve_forever() to return, which runs in this thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.server_close()
        db.dispose()
