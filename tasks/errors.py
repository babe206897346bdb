"""Errors a user can fix: the CLI prints them as one line and exits non-zero."""


class UserError(ValueError):
    """Bad input or an unusable environment, described in one line."""
