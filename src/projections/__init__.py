"""Projections: read models built from messages, their decorators, CLI and example app.

Importing it registers every built-in consumer kind (projections, in-memory projections,
route consumers, sagas), so that its CLI, admin and reports know all their tables.
"""

import sagas._kind  # noqa: F401  (registers the saga kind and its tables)
from messaging import handler
from projections._decorators import in_memory_projection, projection
from projections._health import health_report

__all__ = ["handler", "health_report", "in_memory_projection", "projection"]
