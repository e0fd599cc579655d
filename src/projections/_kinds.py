"""The projection kinds, registered with the engine when :mod:`projections` is imported."""

from __future__ import annotations

from messaging import ConsumerKind, register_kind

PROJECTION = register_kind(
    ConsumerKind(
        value="projection",
        article="a projection",
        settings_group="projections",
        rebuildable=True,
        parks=True,
    )
)
"""Read models in tables, written with fenced checkpoints; rebuilt under a new declaration."""

IN_MEMORY_PROJECTION = register_kind(
    ConsumerKind(
        value="in-memory-projection",
        article="an in-memory projection",
        settings_group="projections",
        transactional=False,
    )
)
"""State kept in the consumer object, built whole from the start on every instance."""
