"""messaging.runtime."""
