"""messaging.distribution."""
