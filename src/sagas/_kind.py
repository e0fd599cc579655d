"""The saga kind, registered with the engine when :mod:`sagas` is imported."""

from __future__ import annotations

from messaging import ConsumerKind, register_kind
from sagas import _hookspecs as hookspecs
from sagas._tables import saga_tables
from sagas._worker import SagaWorker

SAGA = register_kind(
    ConsumerKind(
        value="saga",
        article="a saga",
        settings_group="sagas",
        no_concurrency_limit="a saga is applied in one lane per instance (only projections "
        "have a limit)",
        worker=SagaWorker,
        tables=saga_tables,
        rows_by_consumer={"sagas": "saga", "deadlines": "saga"},
        hookspecs=hookspecs,
        parks=True,
    )
)
"""Sagas: applied in fenced batches with their states and deadlines; never rebuilt (a
replay would repeat the commands they sent); a failure may park its instance."""
