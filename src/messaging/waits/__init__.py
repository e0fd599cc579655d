"""Waiting for a write: how far each consumer has applied a consistency token, and the
waits that watch it (client-side: they need the database, not an instance)."""
