"""Sagas: long-running processes with versioned state, commands and deadlines."""

from sagas.context import SagaContext
from sagas.decorators import saga, start
from sagas.options import SagaOptions
from sagas.store import Deadline, SagaStore
from sagas.worker import SagaWorker

__all__ = ["Deadline", "SagaContext", "SagaOptions", "SagaStore", "SagaWorker", "saga", "start"]
