"""The TorchServe runtime backend: the process, its archive and handler, the JVM, ports and worker
launcher."""
