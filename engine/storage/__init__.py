"""Durable state: the run's SQLite store, the batched exactly-once writer, atomic file output."""
