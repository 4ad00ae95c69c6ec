"""A pool of many models in one serving process (Ignite's regime on CPU nodes)."""
