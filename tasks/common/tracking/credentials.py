"""Credentials for authenticated MLflow and Prefect servers: from the environment or from files only their owner can read.

A client (the CLI, a worker, a benchmark's cells) finds them in its environment: MLflow's own
``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, Prefect's own ``PREFECT_API_AUTH_STRING``.
Where those are not set, ``KARMAN_MLFLOW_AUTH_FILE`` and ``KARMAN_PREFECT_AUTH_FILE`` name files that hold
``user:password`` on one line; a file that its group or others may read is refused. Credentials never
come from a command line, where every user of the host can read them.

    python -m tasks.common.tracking.credentials [--as NAME] COMMAND [ARG ...]   # COMMAND with the credentials in its environment
"""

import os
import stat
import sys
from pathlib import Path

from pydantic import BaseModel, SecretStr

from tasks.common.config.errors import UserError

MLFLOW_FILE_ENV = "KARMAN_MLFLOW_AUTH_FILE"
PREFECT_FILE_ENV = "KARMAN_PREFECT_AUTH_FILE"
MLFLOW_USER_ENV, MLFLOW_PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
PREFECT_AUTH_ENV = "PREFECT_API_AUTH_STRING"


def read_secret_file(path: str | Path, variable: str) -> tuple[str, str]:
    """(user, password) from the file ``path`` (named by the environment variable ``variable``): one line
    ``user:password``. UserError, in one line naming the file, if it is missing, readable by its group
    or others, or not of that form."""
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UserError(f"{variable} {str(path)!r} is open to its group or others (mode {stat.S_IMODE(mode):04o}); "
                            f"make it owner-only: chmod 600 {path}")
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UserError(f"{variable} {str(path)!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
    user, colon, password = text.partition(":")
    if not user or not colon or not password or "\n" in text:
        raise UserError(f"{variable} {str(path)!r} must hold one line 'user:password'")
    return user, password


def plain(value: str, what: str) -> str:
    """``value`` if it is printable ASCII (what HTTP basic authentication carries everywhere: Prefect's
    server fails on anything else); else UserError naming ``what``, never the value."""
    if not (value.isascii() and value.isprintable()):
        raise UserError(f"{what} must be printable ASCII (letters, digits, punctuation)")
    return value


class Credentials(BaseModel, frozen=True):
    """What a client sends to authenticated servers; None where a server is used without."""

    mlflow_user: str | None = None
    mlflow_password: SecretStr | None = None
    prefect_auth: SecretStr | None = None  # Prefect's 'user:password' auth string

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Credentials":
        """From the environment's variables, else from the files it names (UserError for a bad file)."""
        env = os.environ if env is None else env
        user, password = env.get(MLFLOW_USER_ENV), env.get(MLFLOW_PASSWORD_ENV)
        if not (user and password) and env.get(MLFLOW_FILE_ENV):
            user, password = read_secret_file(env[MLFLOW_FILE_ENV], MLFLOW_FILE_ENV)
        prefect = env.get(PREFECT_AUTH_ENV)
        if not prefect and env.get(PREFECT_FILE_ENV):
            prefect = ":".join(read_secret_file(env[PREFECT_FILE_ENV], PREFECT_FILE_ENV))
        if user and password:
            plain(f"{user}:{password}", f"the MLflow user and password ({MLFLOW_USER_ENV}, {MLFLOW_PASSWORD_ENV} or {MLFLOW_FILE_ENV})")
        if prefect:
            plain(prefect, f"the Prefect auth string ({PREFECT_AUTH_ENV} or {PREFECT_FILE_ENV})")
        return cls(mlflow_user=user or None, mlflow_password=password or None, prefect_auth=prefect or None)

    def env(self) -> dict[str, str]:
        """The environment variables MLflow's and Prefect's clients read them from."""
        out = {}
        if self.mlflow_user and self.mlflow_password:
            out |= {MLFLOW_USER_ENV: self.mlflow_user, MLFLOW_PASSWORD_ENV: self.mlflow_password.get_secret_value()}
        if self.prefect_auth:
            out[PREFECT_AUTH_ENV] = self.prefect_auth.get_secret_value()
        return out


def auth_refused(url: str, auth: str | None, timeout_s: float = 5.0) -> int | None:
    """The HTTP status (401 or 403) with which the server refuses a GET of ``url`` sent with the basic-auth
    ``user:password`` ``auth`` (or with none); None where it serves it, or does not answer (the request
    that follows says why)."""
    import base64
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        return exc.code if exc.code in (401, 403) else None
    except OSError:
        return None
    return None


def main(argv: list[str]) -> int:
    """Exec ``argv`` with the credentials in its environment; a bad credentials file: one line (from
    ``--as NAME``, the script that asked), exit 2."""
    name = "python -m tasks.common.tracking.credentials"
    if argv[:1] == ["--as"] and len(argv) > 1:
        name, argv = argv[1], argv[2:]
    if not argv:
        print(f"usage: {name} [--as NAME] COMMAND [ARG ...]", file=sys.stderr)
        return 2
    try:
        env = {**os.environ, **Credentials.from_env().env()}
    except UserError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
