"""messaging.store."""
