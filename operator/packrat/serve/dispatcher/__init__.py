"""The serving pod's one public port: routing, slots, connection limits, metrics, the upstream
proxy."""
