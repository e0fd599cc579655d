"""This process among the others of its host: its default instance name, and whether
another pid still runs."""

from __future__ import annotations

import os
import socket

__all__ = ["default_instance_name", "process_exists"]


def default_instance_name() -> str:
    """``host:pid``, unique among the processes of one host."""
    return f"{socket.gethostname()}:{os.getpid()}"


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (as any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, as another user's process
    return True
