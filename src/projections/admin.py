"""A read-only admin server: the reports as JSON over HTTP and a small HTML page.

Routes (``GET`` only):

- ``/admin/consumers``: :func:`projections.reports.consumers_report`;
- ``/admin/instances``: :func:`projections.reports.instances_report`;
- ``/admin/cluster``: the live members and how each consumer's partitions are shared
  among them (:func:`cluster_report`), plus ``answered_by``, this server's host:pid;
- ``/admin``: a self-contained HTML page that shows the three and refreshes every 2 s.

Unknown routes answer 404 and database errors 500, both as ``{"error": "..."}``. Each
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from sqlalchemy.exc import DBAPIError

from messaging import operations
from messaging.database import Database
from messaging.errors import ProjectionsError
from messaging.in_memory import InMemoryOperationError
from messaging.runtime import Instance
from messaging.settings import Distribution, Settings
from projections.reports import OWNED, consumers_report, instances_report

log = logging.getLogger(__name__)

SINGLE_OWNER_REASON = "single-owner: one elected instance applies it"


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

    ``consumers`` and ``instances`` are the two reports of :mod:`projections.reports`.
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
            if p["state"] == OWNED and p.get("instance_id") in owned:
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


def make_server(
    db: Database, settings: Settings, host: str, port: int, instance: Instance | None = None
) -> ThreadingHTTPServer:
    """A (not yet serving) admin server on ``host:port``; port 0 picks a free one. Served
    beside an ``instance``, the POST commands for its in-memory consumers act on its copy."""
    consumer_settings = settings.messaging.consumer
    me = identity()
    routes: dict[str, Callable[[], dict[str, Any]]] = {
        "/admin/consumers": lambda: consumers_report(db, consumer_settings),
        "/admin/instances": lambda: instances_report(db, consumer_settings),
        "/admin/cluster": lambda: cluster_report(
            consumers_report(db, consumer_settings),
            instances_report(db, consumer_settings),
            me,
        ),
    }

    class Handler(BaseHTTPRequestHandler):
        server_version = "projections-admin"

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, data: Any) -> None:
            body = json.dumps(data, default=str).encode()
            self._send(status, body, "application/json")

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            if path == "/admin":
                self._send(200, ADMIN_PAGE.encode(), "text/html; charset=utf-8")
                return
            route = routes.get(path)
            if route is None:
                self._json(404, {"error": f"no such route: {path}"})
                return
            try:
                data = route()
            except Exception as exc:
                log.warning("admin %s failed: %s", path, _one_line(exc))
                kind = "database: " if isinstance(exc, DBAPIError) else ""
                self._json(500, {"error": kind + _one_line(exc)})
                return
            self._json(200, data)

        def do_POST(self) -> None:
            """``POST /admin/consumers/<name>/<pause|resume|rebuild>`` with an optional JSON
            body ``{"who", "reason", "skip_poison"}``: the operator commands."""
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            if (
                len(parts) != 4
                or parts[:2] != ["admin", "consumers"]
                or parts[3]
                not in (
                    "pause",
                    "resume",
                    "rebuild",
                )
            ):
                self._json(404, {"error": f"no such route: POST {self.path}"})
                return
            consumer, command = parts[2], parts[3]
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                who = str(body.get("who") or f"admin@{self.client_address[0]}")
                reason = str(body.get("reason") or "")
            except ValueError as exc:
                self._json(400, {"error": f"bad request: {exc}"})
                return
            try:
                result: dict[str, Any] = {"consumer": consumer, "command": command}
                if instance is not None and consumer in instance.in_memory:
                    skip = bool(body.get("skip_poison"))
                    result = instance.operate_in_memory(consumer, command, skip_poison=skip)
                elif command == "pause":
                    operations.pause(db, consumer, who=who, reason=reason)
                elif command == "rebuild":
                    operations.rebuild(db, consumer, who=who, reason=reason)
                else:
                    result["halted"] = operations.resume(
                        db,
                        consumer,
                        who=who,
                        reason=reason,
                        skip_poison=bool(body.get("skip_poison")),
                    )
            except (operations.OperationError, InMemoryOperationError) as exc:
                self._json(409, {"error": str(exc)})
                return
            except Exception as exc:
                log.warning("admin POST %s failed: %s", self.path, _one_line(exc))
                self._json(500, {"error": _one_line(exc)})
                return
            self._json(200, result)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("admin %s - %s", self.address_string(), format % args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve(db: Database, settings: Settings, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM, then close the server and dispose the engine."""
    try:
        server = make_server(db, settings, host, port)
    except OSError as exc:
        db.dispose()
        raise ProjectionsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound_host, bound_port = server.server_address[:2]
    print(f"admin page: http://{bound_host!s}:{bound_port}/admin", flush=True)

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


ADMIN_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>projections admin</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
  h1 { font-size: 1.4em; margin: 0 0 .2em; }
  h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
  #status { color: #666; font-size: .9em; }
  #status.error { color: #b00020; font-weight: bold; }
  table { border-collapse: collapse; background: #fff; margin-bottom: .5em; }
  th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
  th { background: #eef; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  tr.halted td { background: #fde0e0; }
  tr.halted td.error { color: #b00020; }
  .OWNED { color: #176f2c; } .ORPHANED { color: #b35c00; } .UNCLAIMED { color: #888; }
  .bar { display: inline-block; height: .8em; background: #5b7fd6; vertical-align: middle; }
  .muted { color: #777; }
  li.rebuilding { color: #1b4fb3; font-weight: bold; }
</style>
</head>
<body>
<h1>projections admin</h1>
<div id="status">loading…</div>
<h2>Consumers</h2>
<ul id="consumer-states"></ul>
<table id="consumers">
  <thead><tr><th>consumer</th><th>partition</th><th>instance</th><th>state</th>
  <th>status</th><th>checkpoint</th><th>lag</th><th>error</th></tr></thead>
  <tbody></tbody>
</table>
<h2>Instances</h2>
<table id="instances">
  <thead><tr><th>name</th><th>id</th><th>host:pid</th><th>live</th><th>stopping</th>
  <th>heartbeat age (s)</th></tr></thead>
  <tbody></tbody>
</table>
<h2>Cluster</h2>
<div id="cluster"></div>
<script>
"use strict";
function el(tag, attrs, children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children || []) {
    node.append(c instanceof Node ? c : document.createTextNode(c == null ? "-" : String(c)));
  }
  return node;
}
function td(value, cls) { return el("td", cls ? {class: cls} : {}, [value]); }
async function getJSON(path) {
  const response = await fetch(path, {cache: "no-store"});
  const data = await response.json();
  if (!response.ok) throw new Error(path + ": " + (data.error || response.status));
  return data;
}
function consumerState(c) {
  if (!c.rebuild) return c.name + ": " + c.state;
  const r = c.rebuild;
  const percent = r.total ? (100 * r.replayed / r.total).toFixed(1) : "100.0";
  return c.name + ": " + c.state + " " + r.replayed + "/" + r.total + " (" + percent +
    "%) replayed up to position " + r.target;
}
function renderConsumers(report) {
  document.getElementById("consumer-states").replaceChildren(...report.consumers.map(
    (c) => el("li", {"data-consumer-state": c.name, class: c.state}, [consumerState(c)])));
  const rows = [];
  for (const c of report.consumers) {
    for (const p of c.partitions) {
      const attrs = {"data-partition": String(p.partition), "data-consumer": c.name};
      if (p.halted) attrs.class = "halted";
      const error = p.halted
        ? "halted at " + p.halted.position + " (" + p.halted.type + "): " + p.halted.error
        : "";
      const where = p.halted && p.halted.trace
        ? el("details", {}, [el("summary", {}, ["where"]), el("pre", {}, [p.halted.trace])])
        : "";
      rows.push(el("tr", attrs, [
        td(c.name), td(p.partition, "num"), td(p.instance), td(p.state, p.state),
        td(p.status), td(p.checkpoint, "num"), td(p.lag, "num"),
        el("td", {class: "error"}, [error, where]),
      ]));
    }
  }
  document.querySelector("#consumers tbody").replaceChildren(...rows);
}
function renderInstances(report) {
  const now = Date.now() / 1000;
  const rows = report.instances.map((i) => el("tr", {"data-instance": i.id}, [
    td(i.name), td(i.id), td(i.host + ":" + i.pid), td(i.live ? "yes" : "no"),
    td(i.stopping ? "yes" : "no"), td(Math.max(0, now - i.heartbeat_at).toFixed(1), "num"),
  ]));
  document.querySelector("#instances tbody").replaceChildren(...rows);
}
function fmtRanges(ranges) {
  if (!ranges.length) return "—";
  return ranges.map(([a, b]) => (a === b ? String(a) : a + "\\u2013" + b)).join(", ");
}
function renderCluster(report) {
  const parts = [el("p", {class: "muted"}, [
    report.members.length + " live member(s); answered by " + report.answered_by])];
  for (const c of report.consumers) {
    parts.push(el("h3", {}, [c.name + " (" + c.distribution + ", " + c.partitions +
                              " partitions)"]));
    if (c.reason) parts.push(el("p", {class: "muted"}, [c.reason]));
    const rows = c.shares.map((s) => el("tr", {"data-member": s.id}, [
      td(s.instance), td(fmtRanges(s.ranges)), td((s.share * 100).toFixed(1) + "%", "num"),
      el("td", {}, [el("span", {class: "bar", style: "width:" + (s.share * 200) + "px"})]),
    ]));
    if (c.unowned.length) {
      rows.push(el("tr", {}, [td("(not owned)"), td(fmtRanges(c.unowned)), td(""), td("")]));
    }
    parts.push(el("table", {}, [
      el("thead", {}, [el("tr", {}, [el("th", {}, ["member"]), el("th", {}, ["ranges"]),
                                    el("th", {}, ["share"]), el("th", {}, [""])])]),
      el("tbody", {}, rows),
    ]));
  }
  document.getElementById("cluster").replaceChildren(...parts);
}
async function refresh() {
  const status = document.getElementById("status");
  try {
    const [consumers, instances, cluster] = await Promise.all(
      ["/admin/consumers", "/admin/instances", "/admin/cluster"].map(getJSON));
    renderConsumers(consumers);
    renderInstances(instances);
    renderCluster(cluster);
    status.className = "";
    status.textContent = "updated " + new Date().toLocaleTimeString() + " (every 2 s)";
  } catch (error) {
    status.className = "error";
    status.textContent = "refresh failed: " + error.message;
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
"""
