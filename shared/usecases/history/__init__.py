"""Orders at rest: the rest index's backfill and the archive."""
