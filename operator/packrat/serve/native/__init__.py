"""The native runtime: the dispatcher hands each plan instance its batches over a Unix socket
to a worker process forked from the pod's zygote (no JVM, no HTTP hop)."""
