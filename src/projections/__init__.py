"""Projections: read models built from messages, their decorators, CLI and example app."""

from messaging.consumers import handler
from projections.decorators import in_memory_projection, projection

__all__ = ["handler", "in_memory_projection", "projection"]
