"""``GET /admin/consumers/<name>/progress`` consumed by a real browser (headless Chromium
over the DevTools protocol), on both backends. A page of the admin's own origin opens an
``EventSource`` on it and:

- gets a ``progress`` event (a named event: ``onmessage`` sees none) for each checkpoint
  advance once an append is applied, carrying the committed head and each partition's
  checkpoint and status; checkpoints only grow and never pass the head;
- when the server ends the stream, reconnects by itself: the stream sends no event ids
  (so no ``Last-Event-ID`` to resume from) because each event is the whole state, the
  first one after reconnecting included, so nothing appended in the gap is missed;
- frees the server's long-request slot, its handler thread and the connection when the
  page lets go: ``es.close()``, closing the tab, or aborting a ``fetch`` of ``/wait``;
- gives up (``CLOSED``, no retries) on an unknown consumer's 404.

The page is the admin's 404 for a path of no route: a document of the admin's origin whose
answer closes its connection, so the server's open connections are the page's own."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from admin_client import get_json, served_admin
from cdp import Browser
from clusters import wait_until
from ledger_waits import CONSUMER, deposit, ledger_instance, wait_url

from messaging import Database
from messaging.store._rows import partition_of

pytestmark = pytest.mark.multiprocess

PAGE = "/admin/a-page-of-the-admin-origin"
PARTITIONS = 8  # the ledger's

LISTEN = """
window.seen = []; window.opens = 0; window.errors = []; window.messages = 0;
window.es = new EventSource(%s);
es.onopen = () => { opens += 1; };
es.onerror = () => { errors.push(es.readyState); };
es.onmessage = () => { messages += 1; };
es.addEventListener("progress", (event) => seen.push(
  {connection: opens, id: event.lastEventId, data: JSON.parse(event.data)}));
"""
"""Opens the stream of a consumer; records each event with the connection it came on."""

CONNECTING, OPEN, CLOSED = 0, 1, 2  # EventSource.readyState


def _listen(browser: Browser, base: str, consumer: str = CONSUMER) -> None:
    """Open the page, and in it an ``EventSource`` on ``consumer``'s progress stream."""
    browser.open(base + PAGE)
    browser.evaluate(LISTEN % json.dumps(f"/admin/consumers/{consumer}/progress"))


def _applied(browser: Browser, account: str, position: int) -> list[dict[str, Any]]:
    """The events the page has once one shows ``account``'s deposit at ``position`` applied
    (the head there, and its partition's checkpoint)."""
    partition = partition_of(account, PARTITIONS)
    shown = (
        f"e.data.head === {position} && e.data.partitions[{partition}].checkpoint === {position}"
    )
    events: list[dict[str, Any]] = browser.wait_for(f"seen.some((e) => {shown}) && seen", 10)
    return events


def _assert_ordered(events: list[dict[str, Any]]) -> None:
    """Each event differs from the one before; heads and checkpoints only grow; no
    checkpoint passes the head; no event has an id."""
    for before, after in itertools.pairwise(events):
        assert before["data"] != after["data"] or after["connection"] != before["connection"]
        assert before["data"]["head"] <= after["data"]["head"]
        for old, new in zip(before["data"]["partitions"], after["data"]["partitions"], strict=True):
            assert old["checkpoint"] <= new["checkpoint"]
    for event in events:
        assert event["id"] == ""
        assert all(p["checkpoint"] <= event["data"]["head"] for p in event["data"]["partitions"])


def test_the_browser_gets_an_event_for_each_checkpoint_advance(
    db: Database, browser: Browser
) -> None:
    instance = ledger_instance(db)
    instance.start()
    try:
        with served_admin(db, max_threads=2) as (base, _):
            _listen(browser, base)
            first = browser.wait_for("seen[0]")
            assert first == {
                "connection": 1,
                "id": "",
                "data": {
                    "consumer": CONSUMER,
                    "head": 0,
                    "partitions": [
                        {"partition": n, "checkpoint": 0, "status": "running"}
                        for n in range(PARTITIONS)
                    ],
                },
            }
            positions = []
            for account in ("ann", "bob", "cy", "dee"):
                position = deposit(db, account, 5)[0]
                positions.append(position)
                events = _applied(browser, account, position)
            _assert_ordered(events)
            assert {e["data"]["head"] for e in events} >= {0, *positions}  # one per advance
            assert browser.evaluate("[opens, errors, messages, es.readyState]") == [1, [], 0, OPEN]
    finally:
        instance.stop()


def test_the_browser_reconnects_when_the_server_ends_the_stream(
    db: Database, browser: Browser
) -> None:
    """The first server ends the stream (it closes, as at the stream's time limit: the
    response ends); the browser reconnects, after its default delay, to the next server on
    the same port, whose first event has what was appended in between."""
    instance = ledger_instance(db)
    instance.start()
    try:
        with served_admin(db, max_threads=2) as (base, first):
            _listen(browser, base)
            before = _applied(browser, "early", deposit(db, "early")[0])
            port = first.server_address[1]
        assert browser.wait_for("errors.length && errors") == [CONNECTING]  # it will retry
        gap = deposit(db, "in-the-gap")[0]  # committed before the next server listens
        with served_admin(db, max_threads=2, port=port) as (again, _):
            assert again == base
            browser.wait_for("opens === 2", 10)
            reconnected = browser.wait_for("seen.find((e) => e.connection === 2)")
            assert reconnected["data"]["head"] == gap  # the whole state, the gap included
            events = _applied(browser, "in-the-gap", gap)
            events = _applied(browser, "late", deposit(db, "late")[0])  # and it goes on
        assert events[: len(before)] == before
        _assert_ordered(events)
        assert browser.evaluate("[opens, messages]") == [2, 0]
    finally:
        instance.stop()


WAIT = """
window.ctl = new AbortController(); window.answer = null;
const ask = () => fetch(%s, {signal: ctl.signal}).then(
  (r) => { if (r.status === 503) setTimeout(ask, 100); else answer = r.status; },
  (e) => { answer = e.name; });
ask(); 1;
"""
"""Waits for a token; asks again after a 503 (the test's probe held the one slot)."""

CLOSERS = {
    "es.close()": "es.close()",
    "closing the tab": None,
    "aborting a fetch of /wait": "ctl.abort()",
}


@pytest.mark.parametrize("how", list(CLOSERS))
def test_a_page_that_lets_go_frees_the_thread_and_connection(
    db: Database, browser: Browser, how: str
) -> None:
    """With 2 handler threads one long request may run: while the page's runs, another
    wait is refused 503; once the page lets go, the server notices at its next poll: its
    handler returns (the slot is free: a wait is answered) and the connection is closed."""
    instance = ledger_instance(db)
    instance.start(loops=False)
    instance.stop()
    token = deposit(db, "never-applied").token  # no instance applies it: waits go on
    with served_admin(db, max_threads=2) as (base, server):
        if how.startswith("aborting"):
            browser.open(base + PAGE)
            browser.evaluate(WAIT % json.dumps(wait_url("", token, "60")))
        else:
            _listen(browser, base)
            browser.wait_for("seen.length")
        refused = wait_until(
            lambda: (answer := get_json(wait_url(base, token, "0")))[0] == 503 and answer[1],
            timeout=10,
            what="the page's long request to run",
        )
        assert "too many waits and progress streams open at once (1)" in refused["error"]
        wait_until(
            lambda: server.open_connections == 1, timeout=5, what="the page's connection alone"
        )

        started = time.monotonic()
        closer = CLOSERS[how]
        if closer is None:
            browser.close_tab()
        else:
            browser.evaluate(closer)
        wait_until(
            lambda: get_json(wait_url(base, token, "0"))[0] == 408, timeout=5, what="a free slot"
        )
        wait_until(lambda: server.open_connections == 0, timeout=5, what="the connection closed")
        assert time.monotonic() - started < 3
        if how.startswith("aborting"):
            assert browser.evaluate("answer") == "AbortError"


def test_the_browser_gives_up_on_an_unknown_consumer(db: Database, browser: Browser) -> None:
    with served_admin(db, max_threads=2) as (base, server):
        _listen(browser, base, "nope")
        assert browser.wait_for("errors.length && errors") == [CLOSED]
        assert browser.evaluate("[opens, seen.length, es.readyState]") == [0, 0, CLOSED]
        wait_until(lambda: server.open_connections == 0, timeout=5, what="no connection left")
