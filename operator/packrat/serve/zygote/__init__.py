"""The zygote: one process that imported torch and mapped the weights, forking workers."""
