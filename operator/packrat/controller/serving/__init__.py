"""The serving slots: pure builders for the Deployments, the Service and the plan ConfigMaps, and
bringing them to what they should be."""
