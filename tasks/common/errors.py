"""Errors a user can fix: the CLI prints them as one line and exits non-zero."""


class UserError(ValueError):
    """Bad input or an unusable environment, described in one line."""


class RunFailed(RuntimeError):
    """A run that started and then failed for a reason one line explains (a diverging loss, ...)."""
