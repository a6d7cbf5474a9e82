"""The two kinds of failure a user sees: one line, no traceback (``--debug`` shows one), and an exit status."""


class AppError(Exception):
    """A runtime failure the user can act on (corrupt data file, no checkpoint, a launcher that failed)."""

    exit_code = 1


class UsageError(AppError):
    """Bad input: an option, a config key or value, a path. Exit status 2, like Click's own usage errors."""

    exit_code = 2
