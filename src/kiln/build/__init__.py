"""Running the graph: cache keys, store, sources, runners and the scheduler."""
