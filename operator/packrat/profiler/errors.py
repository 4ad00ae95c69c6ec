"""The profiler's one user-facing error."""


class ProfilerError(RuntimeError):
    """The profile cannot be (or could not be) measured as asked; the message says why."""
