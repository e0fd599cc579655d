"""What ``projections demo`` shows: a view of the read model and its owners, and the
console lines it prints."""

from __future__ import annotations

import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence

import attrs


@attrs.frozen
class View:
    """The cluster as the reports show it at one moment."""

    written: int
    """Messages written before the reports were read."""
    writing: bool
    """Whether the writer was still writing then."""
    lag: int
    owned: Counter[str]
    """Instance name → partitions it owns while live (OWNED)."""
    orphaned: int
    unclaimed: int
    live: frozenset[str]

    @property
    def applied(self) -> int:
        return max(0, self.written - self.lag)

    def owned_by(self, names: Sequence[str]) -> bool:
        """Every partition is OWNED by one of ``names``."""
        return self.orphaned == self.unclaimed == 0 and set(self.owned) <= set(names)

    def balanced_over(self, names: Sequence[str]) -> bool:
        """Every partition is OWNED by ``names``, each holding its share (±1)."""
        counts = [self.owned[n] for n in names]
        return self.owned_by(names) and max(counts) - min(counts) <= 1


class Console:
    """Event lines, and a live status line: rewritten in place on a terminal, otherwise
    printed about once a second and whenever partition ownership changes."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.every = 0.25 if self.tty else 1.0
        self.started = time.monotonic()
        self._last_printed = -1.0
        self._last_owners: object = None
        self._pending = 0  # width of the status line a terminal shows unfinished

    def stamp(self) -> str:
        return f"[{time.monotonic() - self.started:5.1f}s]"

    def say(self, text: str) -> None:
        self._clear()
        print(f"{self.stamp()} {text}", flush=True)

    def status(self, view: View, killed: str | None) -> None:
        now = time.monotonic()
        owners = (sorted(view.owned.items()), view.orphaned, view.unclaimed)
        changed, self._last_owners = owners != self._last_owners, owners
        if not changed and now - self._last_printed < self.every:
            return
        self._last_printed = now
        shares = ", ".join(
            f"{name}{' (killed)' if name == killed else ''} {count}"
            for name, count in sorted(view.owned.items())
        )
        line = (
            f"{self.stamp()}   applied {view.applied:>6}/{view.written:<6} lag {view.lag:>5} | "
            f"partitions: {shares or '-'} | orphaned {view.orphaned}"
            + (f", unclaimed {view.unclaimed}" if view.unclaimed else "")
        )
        if self.tty:  # one screen line, or "\r" cannot rewrite it
            line = line[: shutil.get_terminal_size().columns - 1]
        if not self.tty:
            print(line, flush=True)
        elif changed:  # keep ownership changes on screen
            self._clear()
            print(line, flush=True)
        else:
            sys.stdout.write("\r" + line.ljust(self._pending))
            sys.stdout.flush()
            self._pending = len(line)

    def _clear(self) -> None:
        if self._pending:
            sys.stdout.write("\r" + " " * self._pending + "\r")
            self._pending = 0
