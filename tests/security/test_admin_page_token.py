"""The admin page's buttons, clicked in a real headless Chromium: the page asks for the
token once, keeps it for the tab, sends it with JSON, and shows a refusal plainly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from admin_client import TOKEN
from admin_target import TARGET, LiveAdmin
from cdp import WAIT_FOR, Browser

from projections._operations import audit_log

pytestmark = pytest.mark.multiprocess


def _click(browser: Browser, verb: str, *, answer: str | None, reason: str = "") -> dict[str, Any]:
    """Click ``verb`` of the target consumer, answering the token prompt with ``answer``;
    return the command line the page shows, how often it prompted, and what it stored."""
    script = f"""(async () => {{
      {WAIT_FOR}
      window.prompts = window.prompts || 0;
      window.prompt = () => {{ window.prompts++; return {json.dumps(answer)}; }};
      document.getElementById("reason").value = {json.dumps(reason)};
      const line = document.getElementById("command");
      line.textContent = "";
      const selector = 'button[data-command="{verb}"][data-target="{TARGET}"]';
      (await waitFor(() => document.querySelector(selector))).click();
      await waitFor(() => line.textContent);
      return {{text: line.textContent, refused: line.className === "refused",
               prompts: window.prompts,
               stored: sessionStorage.getItem("projections-admin-token")}};
    }})()"""
    result: dict[str, Any] = browser.evaluate(script)
    return result


def _state(live: LiveAdmin) -> str:
    state: str = live.snapshot()["consumers"][TARGET][0]
    return state


def test_the_page_asks_for_the_token_once_and_commands_with_it(
    guarded: LiveAdmin, browser: Browser
) -> None:
    browser.open(guarded.base + "/admin")
    paused = _click(browser, "pause", answer=TOKEN, reason="from the page")
    assert paused == {
        "text": f"pause {TARGET}: done",
        "refused": False,
        "prompts": 1,
        "stored": TOKEN,
    }
    assert _state(guarded) == "paused"
    resumed = _click(browser, "resume", answer="never asked")
    assert resumed["text"] == f"resume {TARGET}: done" and resumed["prompts"] == 1
    assert _state(guarded) == "running"
    entries = audit_log(guarded.db, TARGET)[-2:]
    assert [(e["command"], e["who"], e["detail"]["reason"]) for e in entries] == [
        ("pause", "admin token@127.0.0.1", "from the page"),
        ("resume", "admin token@127.0.0.1", ""),
    ]

    # A wrong token is refused in plain sight and forgotten, so the next click asks again.
    browser.evaluate("sessionStorage.clear()")
    before = guarded.baseline()
    refused = _click(browser, "pause", answer="a-wrong-token-0123456789")
    assert refused["refused"] and refused["text"].startswith(f"REFUSED (401) pause {TARGET}: ")
    assert "admin token" in refused["text"] and refused["stored"] is None
    assert guarded.snapshot() == before


def test_without_a_token_configured_the_page_says_commands_are_disabled(
    unguarded: LiveAdmin, browser: Browser
) -> None:
    browser.open(unguarded.base + "/admin")
    before = unguarded.baseline()
    refused = _click(browser, "rebuild", answer=TOKEN)
    assert refused["refused"]
    assert refused["text"].startswith(f"REFUSED (403) rebuild {TARGET}: state-changing commands")
    assert "PROJECTIONS_ADMIN_TOKEN" in refused["text"]
    assert unguarded.snapshot() == before
