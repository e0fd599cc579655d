"""The process's long-lived objects kept out of the garbage collector's full passes.

A started instance holds what it will hold until it stops: the modules imported,
SQLAlchemy's tables and compiled statements, the handlers. Python's full collections
walk every tracked object, so in a process holding a few hundred thousand of them each
one costs tens of milliseconds, and a busy worker, whose batches promote thousands of
short-lived objects, triggers one every few batches (measured with
``benchmarks/deadlines.py``: 0.16-0.20 s of full collections per 20,000 deadlines, 0.015 s
after the freeze). So the first instance a process starts collects once, then moves
every object to the permanent generation (:func:`gc.freeze`), which later collections
skip. Those objects are still freed by reference counting; only a cycle among them that
becomes unreachable later is never collected. ``messaging.gc-freeze: false`` turns it off.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_frozen = False


def freeze_once() -> bool:
    """Collect, then freeze every tracked object, the first time a process calls this;
    True if this call did it."""
    global _frozen
    with _lock:
        if _frozen:
            return False
        gc.collect()
        gc.freeze()
        _frozen = True
        return True
