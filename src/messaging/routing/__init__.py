"""messaging.routing."""
