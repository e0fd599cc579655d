"""A plugin whose heartbeat hook never returns in a process that a test marked by creating
``stuck-<pid>`` in ``$STUCK_DIR``: an instance loop stuck where no timeout can free it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from messaging import hookimpl


@hookimpl
def projections_heartbeat(instance_id: str, seconds: float) -> None:
    marker = Path(os.environ["STUCK_DIR"]) / f"stuck-{os.getpid()}"
    while marker.exists():
        time.sleep(0.05)
