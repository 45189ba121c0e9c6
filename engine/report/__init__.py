"""What a run reports: immutable snapshots, ``datagen status`` from the store, headless progress
lines, and ``datagen export``."""
