"""The one exception type for errors a user can cause and fix."""


class MemstepError(ValueError):
    """A bad input or setting. The message says what to do; the CLI exits 2 with it,
    the app shows it as a toast and keeps serving."""
