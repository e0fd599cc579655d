"""The process's long-lived objects kept out of the garbage collector's full passes.

A started instance holds what it will hold until it stops: the modules imported,
SQLAlchemy's tables and compiled statements, the handlers. Python's full collections
walk every tracked object, so in a process holding a few hundred thousand of them each
one costs tens of milliseconds, and a busy worker, whose batches promote thousands of
short-lived objects, triggers one every few batches (measured with
``benchmarks/deadlines.py``: 0.16-0.20 s of full collections per 20,000 deadlines, 0.015 s
after the freeze). So a process collects once, then moves every object it holds to the
permanent generation (:func:`gc.freeze`), which later collections skip, at two moments:
when its first instance starts, and when a worker of it has applied its first batch (by
then the statements a batch needs, built on first use, are held too: tens of thousands
of objects, which otherwise cost about 2 µs per saga deadline delivered in full
collections). Frozen objects are still freed by reference counting; only a cycle among
them that becomes unreachable later is never collected. ``messaging.gc-freeze: false``
turns it off.
"""

from __future__ import annotations

import gc
import threading
from typing import Literal

Moment = Literal["started", "applied"]
"""When a process freezes its heap: its first instance started, a first batch applied."""

_lock = threading.Lock()
_frozen: set[Moment] = set()


def freeze_once(moment: Moment = "started") -> bool:
    """Collect, then freeze every tracked object, the first time a process reaches
    ``moment``; True if this call did it."""
    with _lock:
        if moment in _frozen:
            return False
        gc.collect()
        gc.freeze()
        _frozen.add(moment)
        return True
