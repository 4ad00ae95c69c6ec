"""PackratPool: many PackratModels served by one set of pool pods under a weight budget."""
