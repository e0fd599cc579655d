"""Failures: a poison message found and halted at, a source parked and retried, a
partition left to an instance that can read a newer payload."""
