"""Errors a user can fix: the CLI prints them as one line and exits non-zero."""


class UserError(ValueError):
    """Bad input or an unusable environment, described in one line."""


class RunFailed(RuntimeError):
    """A run that started and then failed for a reason one line explains (a diverging loss, ...)."""


class RunStopped(RunFailed):
    """A run stopped by a signal (SIGTERM, SIGINT) before it ended; its MLflow run is marked KILLED."""


class Interrupted(BaseException):
    """SIGTERM received by a command: unwinds it like Ctrl-C does, so that children are stopped and runs marked."""

    def __init__(self, signum: int, detail: str = ""):
        super().__init__(f"stopped by {signal_name(signum)}" + (f": {detail}" if detail else ""))
        self.signum = signum


def signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
