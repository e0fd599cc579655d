"""Drive headless Chromium over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
commands on its fd 3, answers on its fd 4, each message JSON ended by a NUL byte), to
click through a page the way a person would."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

from admin_client import CHROMIUM

WAIT_FOR = """
const waitFor = async (check, ms = 15000) => {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const value = check();
    if (value) return value;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error("timed out waiting for " + check);
};
"""
"""JavaScript: ``await waitFor(check, ms)``, the first truthy value of ``check()``, polled
in the page every 50 ms (an error after ``ms``)."""


class Browser:
    """A headless Chromium and one tab; :meth:`evaluate` runs JavaScript in the tab."""

    def __init__(self, profile: Path) -> None:
        assert CHROMIUM is not None, "chromium is needed: apt-get install -y chromium"
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # bash puts the pipes at the fds Chromium expects.
        self._process = subprocess.Popen(
            [
                "bash",
                "-c",
                f'exec "$@" 3<&{to_browser_read} 4>&{from_browser_write}',
                "chromium",
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            pass_fds=(to_browser_read, from_browser_write),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self._session: str | None = None
        self._target: str | None = None

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> Any:
        """Send one command (to the tab once :meth:`open` attached it); return its result."""
        answer = self._exchange(method, params, timeout)
        assert "error" not in answer, answer["error"]
        return answer["result"]

    def _exchange(self, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self._session is not None:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self._next_id:
                    return answer
            left = deadline - time.monotonic()
            assert left > 0, f"no answer to {method} in {timeout} s"
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 16)
                assert chunk, "chromium closed its pipe"
                self._buffer += chunk

    def open(self, url: str) -> None:
        """Open ``url`` in a new tab and direct later commands to it."""
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        attached = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        self._target = target
        self._session = attached["sessionId"]
        loaded = f"location.href === {json.dumps(url)} && document.readyState === 'complete'"
        deadline = time.monotonic() + 30
        while True:  # evaluating while the tab navigates may fail: that is "not yet"
            answer = self._exchange("Runtime.evaluate", {"expression": loaded}, 30)
            if answer.get("result", {}).get("result", {}).get("value") is True:
                return
            assert time.monotonic() < deadline, f"{url} did not load in 30 s"
            time.sleep(0.05)

    def evaluate(self, expression: str, timeout: float = 30) -> Any:
        """The value of ``expression`` in the tab (promises awaited)."""
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            timeout=timeout,
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, check: str, timeout: float = 15) -> Any:
        """The first truthy value of the JavaScript expression ``check``, evaluated in the
        tab every 50 ms; fails after ``timeout`` seconds."""
        ms = int(timeout * 1000)
        return self.evaluate(
            f"(async () => {{ {WAIT_FOR} return await waitFor(() => ({check}), {ms}); }})()",
            timeout=timeout + 10,
        )

    def close_tab(self) -> None:
        """Close the tab :meth:`open` opened, as a person closing it would."""
        assert self._target is not None, "no tab is open"
        self._session = None
        self.call("Target.closeTarget", {"targetId": self._target})
        self._target = None

    def close(self) -> None:
        """Stop Chromium."""
        self._process.kill()
        self._process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
