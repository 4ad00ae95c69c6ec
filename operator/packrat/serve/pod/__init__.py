"""One serving pod's process: cpuset to instances, health, the in-pod switch."""
