"""A real headless Chromium visits a hostile page served from another local port while a
running instance's admin server listens: the page tries a ``no-cors`` fetch, form posts
and a JSON fetch against it, and reads. Nothing changes, with or without a token; the
server saw the requests and refused them. A rebound DNS name gets nothing at all."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from admin_client import chromium, serve
from admin_target import TARGET, LiveAdmin

from projections._admin_guard import WRONG_HOST

pytestmark = pytest.mark.multiprocess

EVIL_PAGE = """<!doctype html>
<html><body>
<iframe name="sink1"></iframe><iframe name="sink2"></iframe>
<form id="urlencoded" method="post" target="sink1" action="ADMIN/admin/consumers/TARGET/pause">
  <input name="reason" value="pwned"></form>
<form id="plain" method="post" target="sink2" enctype="text/plain"
  action="ADMIN/admin/consumers/TARGET/rebuild"><input name='{"reason": "' value='pwned"}'></form>
<pre id="results">running</pre>
<script>
const admin = "ADMIN/admin/consumers/TARGET/";
const results = {};
async function attempt(name, run) {
  try { results[name] = await run(); } catch (error) { results[name] = "blocked: " + error.name; }
}
(async () => {
  await attempt("no-cors rebuild", async () => {
    const r = await fetch(admin + "rebuild", {method: "POST", mode: "no-cors",
                                              body: JSON.stringify({reason: "pwned"})});
    return "sent, opaque: " + r.type;
  });
  await attempt("no-cors text/plain pause", async () => {
    const r = await fetch(admin + "pause", {method: "POST", mode: "no-cors",
      headers: {"Content-Type": "text/plain"}, body: "{}"});
    return "sent, opaque: " + r.type;
  });
  await attempt("json pause", async () => {
    const r = await fetch(admin + "pause", {method: "POST",
      headers: {"Content-Type": "application/json"}, body: "{}"});
    return "status " + r.status;
  });
  await attempt("json pause with a guessed token", async () => {
    const r = await fetch(admin + "pause", {method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer guess"},
      body: "{}"});
    return "status " + r.status;
  });
  await attempt("read", async () => {
    const r = await fetch("ADMIN/admin/consumers");
    return "read " + (await r.text()).length + " bytes";
  });
  document.getElementById("urlencoded").submit();
  document.getElementById("plain").submit();
  document.getElementById("results").textContent = JSON.stringify(results);
})();
</script>
</body></html>
"""


@pytest.fixture
def evil_origin(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, str]]]:
    """(base URL, page holder): a server on another port that serves ``holder["page"]``."""
    holder = {"page": ""}

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = holder["page"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    base, thread = serve(server)
    yield base, holder
    server.shutdown()
    server.server_close()
    thread.join()


def _visit(
    live: LiveAdmin, evil: tuple[str, dict[str, str]], profile: Path, caplog: Any
) -> tuple[dict[str, str], list[str]]:
    """Chromium visits the hostile page; returns what the page found and the requests the
    admin server logged."""
    base, holder = evil
    holder["page"] = EVIL_PAGE.replace("ADMIN", live.base).replace("TARGET", TARGET)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="projections.admin_http"):
        result = chromium(profile, "--dump-dom", url=base + "/")
    assert result.returncode == 0, result.stderr
    match = re.search(r'<pre id="results">(.*?)</pre>', result.stdout, re.S)
    assert match is not None, result.stdout
    seen = [r.getMessage() for r in caplog.records if r.name == "projections.admin_http"]
    return json.loads(match.group(1).replace("&quot;", '"')), seen


def _answered(seen: list[str], method: str, verb: str) -> list[str]:
    """The statuses the server answered to ``method`` requests of ``verb``."""
    pattern = re.compile(rf'"{method} /admin/consumers/{TARGET}/{verb} HTTP/1\.1" (\d+)')
    return [m.group(1) for line in seen for m in [pattern.search(line)] if m]


def _nothing_changes(
    live: LiveAdmin,
    refused: str,
    evil: tuple[str, dict[str, str]],
    profile: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = live.baseline()
    found, seen = _visit(live, evil, profile, caplog)

    assert live.snapshot() == before, "the hostile page changed a consumer or the audit"
    # The simple requests arrived and were refused (401 no token, 403 commands disabled).
    assert sorted(_answered(seen, "POST", "rebuild")) == [refused, refused], seen
    assert sorted(_answered(seen, "POST", "pause")) == [refused, refused], seen
    # Requests with JSON or an Authorization header need a preflight, which fails.
    assert _answered(seen, "OPTIONS", "pause") == ["501", "501"], seen
    assert found["no-cors rebuild"] == "sent, opaque: opaque"
    assert found["json pause"] == "blocked: TypeError"
    assert found["json pause with a guessed token"] == "blocked: TypeError"
    assert found["read"] == "blocked: TypeError"  # no CORS header: nothing to read


def test_a_hostile_page_changes_nothing_with_a_token(
    guarded: LiveAdmin,
    evil_origin: tuple[str, dict[str, str]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _nothing_changes(guarded, "401", evil_origin, tmp_path / "profile", caplog)


def test_a_hostile_page_changes_nothing_without_a_token(
    unguarded: LiveAdmin,
    evil_origin: tuple[str, dict[str, str]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _nothing_changes(unguarded, "403", evil_origin, tmp_path / "profile", caplog)


def test_a_rebound_dns_name_gets_nothing(guarded: LiveAdmin, tmp_path: Path) -> None:
    """DNS rebinding: Chromium resolves evil.test to 127.0.0.1 and loads the admin page
    under that name; the server answers 421 and the page never loads. Under localhost it
    does, as the control."""
    rules = "--host-resolver-rules=MAP evil.test 127.0.0.1"
    rebound = chromium(
        tmp_path / "profile-evil", rules, "--dump-dom", url=f"http://evil.test:{guarded.port}/admin"
    )
    assert rebound.returncode == 0, rebound.stderr
    assert WRONG_HOST in rebound.stdout
    assert "projections admin" not in rebound.stdout
    control = chromium(
        tmp_path / "profile-ok", rules, "--dump-dom", url=f"http://localhost:{guarded.port}/admin"
    )
    assert "<h1>projections admin</h1>" in control.stdout
    assert '<div id="status" class="">updated ' in control.stdout
