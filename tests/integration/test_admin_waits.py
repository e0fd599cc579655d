"""``GET /admin/consumers/<name>/wait`` on both backends, with a real HTTP client: a long
poll that answers 200 once the read model shows the write, 408 naming what is behind,
409 when waiting cannot help, 404/400 for an unknown consumer or bad input; a read that
needs no admin token; a client that disconnects frees its handler thread."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from admin_client import get_json, served_admin
from clusters import wait_until
from ledger_waits import CONSUMER, balance, deposit, ledger_instance, wait_url

from messaging import Database
from messaging.store._rows import partition_of
from projections._admin_http import BoundedHTTPServer
from projections._operations import pause


@pytest.fixture
def base(db: Database) -> Iterator[str]:
    """An admin server with one handler thread (an admin token configured: waits still
    need none)."""
    with served_admin(db, max_threads=1) as (url, _):
        yield url


def test_a_wait_answers_200_once_the_read_model_shows_the_write(db: Database, base: str) -> None:
    instance = ledger_instance(db)
    instance.start()
    try:
        for n in range(10):
            appended = deposit(db, f"web-{n}", 3)
            status, body = get_json(wait_url(base, appended.token))
            assert (status, body) == (200, {"applied": True, "consumer": CONSUMER})
            assert balance(db, f"web-{n}") == 3
    finally:
        instance.stop()


def test_not_applied_in_time_is_408_naming_what_is_behind(db: Database, base: str) -> None:
    instance = ledger_instance(db)
    instance.start(loops=False)
    instance.stop()
    appended = deposit(db, "late")
    expected = {
        "consumer": CONSUMER,
        "partition": partition_of("late", 8),
        "position": appended[0],
        "checkpoint": 0,
        "owner": None,
        "state": "unowned",
    }
    for timeout in ("0", "0.2", "1"):
        started = time.monotonic()
        status, body = get_json(wait_url(base, appended.token, timeout))
        assert time.monotonic() - started < float(timeout) + 1
        assert status == 408 and body["error"].startswith("not applied after")
        [behind] = body["behind"]
        if isinstance(behind, str) and timeout != "1":
            # the last check did not end within 25 ms of the deadline (a loaded machine)
            # and the watcher had not checked yet: the timeout still names the position
            assert f"position(s) {appended[0]} not known to be applied" in behind
            continue
        assert {key: behind.get(key) for key in expected} == expected
    pause(db, CONSUMER, who="test")
    status, body = get_json(wait_url(base, appended.token, "30"))
    assert status == 409 and f"{CONSUMER} is paused" in body["error"]


@pytest.mark.parametrize(
    ("query", "status", "error"),
    [
        ("token=rw1.x.00000000", 400, "invalid consistency token: checksum does not match"),
        ("token=", 400, "invalid consistency token: empty"),
        ("timeout=1", 400, "give token once"),
        ("token=GOOD&token=GOOD", 400, "give token once"),
        ("token=GOOD&timeout=-1", 400, "timeout must be from 0 to 60 seconds"),
        ("token=GOOD&timeout=61", 400, "timeout must be from 0 to 60 seconds"),
        ("token=GOOD&timeout=nan", 400, "timeout must be from 0 to 60 seconds"),
        (
            "token=GOOD&timeout=soon",
            400,
            "timeout must be seconds (2.5) or a duration (500ms), got 'soon'",
        ),
        ("token=GOOD&timeout=2m", 400, "timeout must be from 0 to 60 seconds"),
        ("token=GOOD&wait=1", 400, "unknown parameter(s) wait"),
    ],
)
def test_bad_input_is_400_naming_what_is_wrong(
    db: Database, base: str, query: str, status: int, error: str
) -> None:
    good = quote(str(deposit(db, "x").token))
    answer = get_json(f"{base}/admin/consumers/{CONSUMER}/wait?{query.replace('GOOD', good)}")
    assert answer[0] == status and error in answer[1]["error"], answer


def test_an_unknown_consumer_is_404(db: Database, base: str) -> None:
    status, body = get_json(wait_url(base, deposit(db, "y").token, consumer="nope"))
    assert status == 404 and "unknown consumer 'nope'" in body["error"]


def test_a_client_that_disconnects_mid_wait_frees_its_thread(db: Database, base: str) -> None:
    """The server has one handler thread: a long poll whose client went away would hold it
    for its whole timeout; the next request is served within a second instead."""
    instance = ledger_instance(db)
    instance.start(loops=False)
    instance.stop()
    token = deposit(db, "gone").token
    host, port = base.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    client.sendall(
        f"GET /admin/consumers/{CONSUMER}/wait?token={quote(str(token))}&timeout=60 HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n\r\n".encode()
    )
    client.settimeout(0.3)
    with pytest.raises(TimeoutError):  # the wait goes on (nothing applies the token)
        client.recv(1)
    client.close()
    started = time.monotonic()
    status, _ = get_json(wait_url(base, token, "0"))
    assert status == 408 and time.monotonic() - started < 2


def _open_wait(base: str, token: object) -> socket.socket:
    """A long poll of 60 s left running on a connection of its own."""
    host, port = base.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    client.sendall(
        f"GET /admin/consumers/{CONSUMER}/wait?token={quote(str(token))}&timeout=60 HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n\r\n".encode()
    )
    return client


def _slots_taken(server: BoundedHTTPServer) -> bool:
    """Whether every slot for long requests is held (read, not tried: a try would hold
    one for a moment, and a poll arriving then would be refused)."""
    return server.long_slots._value == 0


def test_long_polls_take_half_the_threads_at_most_so_probes_are_served(db: Database) -> None:
    """With 4 handler threads, 2 long polls may run; a third is answered 503 with
    Retry-After at once, while health probes are still served; once a poll ends, a wait
    is admitted again."""
    instance = ledger_instance(db)
    instance.start(loops=False)
    instance.stop()
    token = deposit(db, "busy").token
    with served_admin(db, max_threads=4) as (base, server):
        polls = [_open_wait(base, token) for _ in range(2)]
        try:
            # both admitted before a check (itself a wait while it is handled) can take a slot
            wait_until(lambda: _slots_taken(server), timeout=10, what="both polls admitted")
            refused = wait_until(  # a check while both polls run: 503
                lambda: (answer := get_json(wait_url(base, token, "0")))[0] == 503 and answer,
                timeout=10,
                what="both polls running",
            )
            assert "too many waits and progress streams open at once (2)" in refused[1]["error"]
            started = time.monotonic()
            for _ in range(5):
                assert get_json(f"{base}/admin/health/live")[0] == 200
            assert time.monotonic() - started < 5
            polls.pop().close()
            assert wait_until(
                lambda: get_json(wait_url(base, token, "0"))[0] == 408, timeout=10, what="admitted"
            )
        finally:
            for client in polls:
                client.close()


# -- GET /admin/consumers/<name>/progress: server-sent events ---------------------------------


def _events(response: http.client.HTTPResponse) -> Iterator[dict[str, object]]:
    """The progress events of an SSE response, as they arrive."""
    data = None
    while line := response.readline():
        text = line.decode().rstrip("\n")
        if text.startswith("data: "):
            data = json.loads(text[len("data: ") :])
        elif text == "" and data is not None:
            yield data
            data = None


def test_the_progress_stream_sends_each_checkpoint_advance(db: Database, base: str) -> None:
    instance = ledger_instance(db)
    instance.start()
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", f"/admin/consumers/{CONSUMER}/progress")
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type") == "text/event-stream"
        events = _events(response)
        first = next(events)
        assert first["consumer"] == CONSUMER and len(first["partitions"]) == 8  # type: ignore[arg-type]  # a list
        appended = deposit(db, "sse", 3)
        partition = partition_of("sse", 8)
        for event in events:  # until the deposit's partition passed it
            rows = event["partitions"]
            assert isinstance(rows, list)
            if rows[partition]["checkpoint"] >= appended[0]:
                break
        assert balance(db, "sse") == 3
    finally:
        connection.close()
        instance.stop()


def test_the_progress_stream_of_an_unknown_consumer_is_404(base: str) -> None:
    status, body = get_json(f"{base}/admin/consumers/nope/progress")
    assert status == 404 and body == {"error": "unknown consumer 'nope'"}


def test_a_stream_whose_client_disconnects_frees_its_thread(db: Database, base: str) -> None:
    instance = ledger_instance(db)
    instance.start(loops=False)
    instance.stop()
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("GET", f"/admin/consumers/{CONSUMER}/progress")
    response = connection.getresponse()
    assert next(_events(response))["consumer"] == CONSUMER
    response.close()
    connection.close()
    started = time.monotonic()
    status, _ = get_json(wait_url(base, deposit(db, "after").token, "0"))  # one thread only
    assert status == 408 and time.monotonic() - started < 3
