"""Sagas: long-running processes with versioned state, commands and deadlines."""

from sagas._context import SagaContext
from sagas._decorators import saga, start, state_upcaster
from sagas._options import SagaOptions
from sagas._rows import Deadline
from sagas._states import UnreadableState
from sagas._store import SagaStore
from sagas._worker import SagaWorker

__all__ = [
    "Deadline",
    "SagaContext",
    "SagaOptions",
    "SagaStore",
    "SagaWorker",
    "UnreadableState",
    "saga",
    "start",
    "state_upcaster",
]
