"""The ports in memory, with the Table adapters' semantics, for tests and tools."""
