"""Raw HTTP against a running instance's admin server, as an attacker would send it:
no or a wrong token, a foreign Host or Origin, form bodies, oversized heads and bodies,
awkward paths. Every refused request leaves the consumers and the audit as they were."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any
from urllib.parse import quote

import odd_names_app
from admin_client import TOKEN
from admin_target import TARGET, LiveAdmin

from projections._admin import COMMANDS
from projections._admin_guard import CROSS_ORIGIN, DISABLED, NOT_JSON, UNAUTHORIZED, WRONG_HOST
from projections._admin_http import MAX_HEAD_BYTES
from projections._operations import MAX_REASON_LENGTH, audit_log

PAUSE = f"/admin/consumers/{TARGET}/pause"
JSON = "application/json"


def exchange(
    port: int,
    method: str,
    path: str,
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    *,
    host: str | None = "",
) -> tuple[int, dict[str, str], Any]:
    """Send one request exactly as given (``host`` "" is the server's own address, None
    leaves the header out) and return (status, headers, decoded JSON body)."""
    lines = [f"{method} {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host or f'127.0.0.1:{port}'}")
    lines += [f"{name}: {value}" for name, value in headers or []]
    if body and not any(name.lower() == "content-length" for name, _ in headers or []):
        lines.append(f"Content-Length: {len(body)}")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(raw)
        response = http.client.HTTPResponse(sock)
        response.begin()
        data = response.read()
        answer_headers = {k.lower(): v for k, v in response.getheaders()}
    assert answer_headers["content-type"] == JSON, data
    return response.status, answer_headers, json.loads(data)


def command(
    port: int, path: str = PAUSE, *, token: str | None = TOKEN, **options: Any
) -> tuple[int, dict[str, str], Any]:
    """A command as a well-behaved client sends it; ``options`` change it."""
    headers = [("Content-Type", options.pop("content_type", JSON))]
    if token is not None:
        headers.append(("Authorization", f"Bearer {token}"))
    headers += options.pop("extra", [])
    return exchange(port, "POST", path, headers, options.pop("body", b"{}"), **options)


def test_a_command_without_the_right_token_is_unauthorized(guarded: LiveAdmin) -> None:
    before = guarded.baseline()
    for token in (None, "", "wrong", TOKEN[:-1], TOKEN + "x", TOKEN.upper()):
        status, headers, body = command(guarded.port, token=token)
        assert (status, body) == (401, {"error": UNAUTHORIZED}), token
        assert headers["www-authenticate"] == "Bearer"
    for name in COMMANDS:  # every state-changing route
        path = f"/admin/consumers/{TARGET}/{name}"
        assert command(guarded.port, path, token="wrong")[:3:2] == (401, {"error": UNAUTHORIZED})
    for scheme in ("Basic", "Token", ""):
        extra = [("Authorization", f"{scheme} {TOKEN}".strip())]
        assert command(guarded.port, token=None, extra=extra)[0] == 401, scheme
    assert guarded.snapshot() == before


def test_without_a_configured_token_commands_are_disabled_and_reads_work(
    unguarded: LiveAdmin,
) -> None:
    before = unguarded.baseline()
    for token in (None, TOKEN, "anything-at-all-long-enough"):
        status, _, body = command(unguarded.port, token=token)
        assert (status, body) == (403, {"error": DISABLED})
    assert "admin.token" in DISABLED and "PROJECTIONS_ADMIN_TOKEN" in DISABLED
    status, _, report = exchange(unguarded.port, "GET", "/admin/consumers")
    assert status == 200 and TARGET in [c["name"] for c in report["consumers"]]
    assert unguarded.snapshot() == before


def test_a_foreign_host_header_is_misdirected_for_reads_and_commands(guarded: LiveAdmin) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends
    its own name as Host; the server answers nothing but 421."""
    port = guarded.port
    before = guarded.baseline()
    for host in (
        "evil.example",
        f"evil.example:{port}",
        f"127.0.0.1:{port + 1}",
        "127.0.0.1",  # port 80
        f"127.0.0.2:{port}",
        f"localhost.evil.example:{port}",
        f"[::1:{port}",
        f"127.0.0.1:{port}:1",
    ):
        for path in ("/admin/consumers", "/admin", "/admin/cluster"):
            assert exchange(port, "GET", path, host=host)[::2] == (421, {"error": WRONG_HOST})
        assert command(port, host=host)[::2] == (421, {"error": WRONG_HOST})
    assert exchange(port, "GET", "/admin/consumers", host=None)[0] == 421  # no Host at all
    two = [("Host", "evil.example")]
    assert exchange(port, "GET", "/admin/consumers", two)[0] == 421  # two Host headers
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert exchange(port, "GET", "/admin/instances", host=host)[0] == 200, host
    assert guarded.snapshot() == before


def test_a_cross_origin_command_is_refused_even_with_the_token(guarded: LiveAdmin) -> None:
    port = guarded.port
    before = guarded.baseline()
    for origin in (
        "http://evil.example",
        f"http://127.0.0.1:{port + 1}",
        f"http://localhost:{port}.evil.example",
        "null",
        "",
    ):
        for name in COMMANDS:
            path = f"/admin/consumers/{TARGET}/{name}"
            status, _, body = command(port, path, extra=[("Origin", origin)])
            assert (status, body) == (403, {"error": CROSS_ORIGIN}), (origin, name)
    assert guarded.snapshot() == before


def test_form_and_text_bodies_are_refused_even_with_the_token(guarded: LiveAdmin) -> None:
    """What a <form> or a no-cors fetch can send is never a command."""
    before = guarded.baseline()
    for content_type, body in (
        ("application/x-www-form-urlencoded", b"reason=x"),
        ("multipart/form-data; boundary=x", b"--x--\r\n"),
        ("text/plain", b'{"reason": "x"}'),
        ("application/jsonx", b"{}"),
    ):
        status, _, answer = command(guarded.port, content_type=content_type, body=body)
        assert (status, answer) == (415, {"error": NOT_JSON}), content_type
    headers = [("Authorization", f"Bearer {TOKEN}")]  # and no content type at all
    assert exchange(guarded.port, "POST", PAUSE, headers, b"{}")[0] == 415
    assert guarded.snapshot() == before


def test_bad_bodies_are_answered_400_or_413_and_change_nothing(guarded: LiveAdmin) -> None:
    port = guarded.port
    before = guarded.baseline()
    long_reason = json.dumps({"reason": "r" * (MAX_REASON_LENGTH + 1)}).encode()
    for body, needle in (
        (long_reason, f"at most {MAX_REASON_LENGTH}"),
        (b'{"who": "the boss"}', "unknown key(s) 'who'"),
        (b"[1]", "must be a JSON object"),
        (b"{not json", "bad request"),
        (b'{"reason": 5}', "'reason' must be a string"),
        (b'{"skip_poison": "yes"}', "'skip_poison' must be true or false"),
        (b'{"version": "2"}', "'version' must be a whole number from 1"),
        (b'{"version": 0}', "'version' must be a whole number from 1"),
        (b'{"version": true}', "'version' must be a whole number from 1"),
    ):
        status, _, answer = command(port, body=body)
        assert status == 400 and needle in answer["error"], (body, answer)
    status, _, answer = command(port, body=b"{}", extra=[("Content-Length", str(16 * 1024 + 1))])
    assert status == 413, answer  # refused before the body is read
    huge = json.dumps({"reason": "x" * 200_000}).encode()
    assert command(port, body=huge)[0] == 413
    chunked = [("Transfer-Encoding", "chunked")]
    assert command(port, body=b"2\r\n{}\r\n0\r\n\r\n", extra=chunked)[0] == 411
    assert guarded.snapshot() == before


def test_oversized_heads_are_refused_and_the_server_goes_on(guarded: LiveAdmin) -> None:
    port = guarded.port
    big = [("X-Filler", "a" * (MAX_HEAD_BYTES + 1))]
    assert exchange(port, "GET", "/admin/consumers", big)[0] == 431
    many = [(f"X-Filler-{i}", "a" * 200) for i in range(MAX_HEAD_BYTES // 200 + 1)]
    assert exchange(port, "GET", "/admin/consumers", many)[0] == 431
    assert command(port, extra=many)[0] == 431
    long_path = "/admin/consumers/" + "a" * 70_000 + "/pause"
    assert exchange(port, "GET", long_path)[0] == 414
    assert exchange(port, "GET", "/admin/consumers")[0] == 200


def test_percent_encoded_names_are_operated_and_traversal_finds_nothing(
    guarded: LiveAdmin,
) -> None:
    """A consumer named with a space, a slash, ?, #, % and ü is paused and resumed by its
    percent-encoded name; encoded traversal is just an unknown consumer."""
    name = odd_names_app.CONSUMER
    route = f"/admin/consumers/{quote(name, safe='')}"
    status, _, answer = command(guarded.port, f"{route}/pause")
    assert (status, answer) == (200, {"consumer": name, "command": "pause"})
    states = guarded.snapshot()["consumers"]
    assert states[name][0] == "paused" and states[TARGET][0] == "running"
    assert command(guarded.port, f"{route}/resume")[0] == 200
    assert [e["command"] for e in audit_log(guarded.db, name)][-2:] == ["pause", "resume"]

    before = guarded.baseline()
    status, _, answer = command(guarded.port, "/admin/consumers/..%2F..%2Fetc%2Fpasswd/pause")
    assert status == 409 and answer["error"].startswith("unknown consumer '../../etc/passwd'")
    assert command(guarded.port, "/admin/consumers/%ff%fe/pause")[0] == 404  # not UTF-8
    assert exchange(guarded.port, "GET", "/admin/%ff")[0] == 400
    status, _, report = exchange(guarded.port, "GET", "/admin/%63onsumers")
    assert status == 200 and name in [c["name"] for c in report["consumers"]]
    assert guarded.snapshot() == before


def test_an_authorized_same_origin_command_is_applied_and_audited_with_the_peer(
    guarded: LiveAdmin,
) -> None:
    """The positive control: with the token, JSON and its own Origin, the page's request
    pauses; the audit names the token and the peer, never a name the client gave."""
    port = guarded.port
    origin = [("Origin", f"http://127.0.0.1:{port}")]
    body = json.dumps({"reason": "maintenance"}).encode()
    assert command(port, extra=origin, body=body)[::2] == (
        200,
        {"consumer": TARGET, "command": "pause"},
    )
    assert command(port, f"/admin/consumers/{TARGET}/resume", host=f"localhost:{port}")[0] == 200
    entries = audit_log(guarded.db, TARGET)[-2:]
    assert [(e["command"], e["who"], e["detail"]["reason"]) for e in entries] == [
        ("pause", "admin token@127.0.0.1", "maintenance"),
        ("resume", "admin token@127.0.0.1", ""),
    ]
