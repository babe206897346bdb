"""Pull steps for deployments that run anywhere: clone the repository at one commit, work in the clone, install the pool's requirements.

``infra/deploy.sh`` runs ``python -m infra.pull_steps PREFECT_YAML OUTPUT`` when ``KARMAN_REPO_URL`` is set.
It checks, before anything is deployed, that git reaches the repository, that the repository holds the
commit (``KARMAN_REPO_COMMIT``: a commit id, or a name this checkout's git resolves, default ``HEAD``) and
that the commit holds every pool's requirements file; then it writes PREFECT_YAML to OUTPUT with a ``pull``
section on every deployment, for ``prefect deploy --all --prefect-file OUTPUT``. A worker then needs no
checkout: each flow run clones the repository into its working folder (``karman-bench``), checks the commit
out, makes the clone its working directory and installs the requirements file that its deployment's
``work_pool.requirements`` names (prefect.yaml's pool definitions; the key is removed from OUTPUT) into the
worker's Python. Anything refused is one line on stderr, exit 2, nothing written.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import yaml

from tasks.common.config.errors import UserError

REPO_URL_ENV = "KARMAN_REPO_URL"
REPO_COMMIT_ENV = "KARMAN_REPO_COMMIT"
CLONE_FOLDER = "karman-bench"
FULL_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
GIT_TIMEOUT_S = 300
# no prompt for a user name or password: a repository that needs one and has none configured fails at once
GIT_ENV = {"GIT_TERMINAL_PROMPT": "0"}


def shown(url: str) -> str:
    """``url`` without the user and password a URL may carry, for messages."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 1, "", f"git {args[0]} took more than {GIT_TIMEOUT_S} s")


def _reason(done: subprocess.CompletedProcess, url: str) -> str:
    """git's first fatal line (else its last line), with the URL's credentials left out."""
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip() and not line.startswith("warning:")]
    fatal = [line for line in lines if line.startswith("fatal:")]
    reason = fatal[0] if fatal else lines[-1] if lines else f"exit status {done.returncode}"
    return reason.replace(url, shown(url))


def resolve_commit(value: str, checkout: Path) -> str:
    """The full commit id that ``value`` names: itself where it is one, else what git makes of it in ``checkout``
    (``HEAD``, a tag, a branch, a short id)."""
    value = value.strip()
    if FULL_COMMIT.match(value):
        return value
    done = _git("rev-parse", "--verify", "--quiet", f"{value}^{{commit}}", cwd=checkout)
    if done.returncode != 0 or not FULL_COMMIT.match(done.stdout.strip()):
        raise UserError(f"{REPO_COMMIT_ENV} {value!r} is not a commit this checkout knows; give a full commit id "
                        "or a name git resolves here (HEAD, a tag, a branch)")
    return done.stdout.strip()


def check_repository(url: str, commit: str, files: set[str]) -> None:
    """UserError unless git reaches ``url``, the repository there holds ``commit`` and the commit holds ``files``."""
    if not url.strip():
        raise UserError(f"{REPO_URL_ENV} is empty; set it to the URL of the repository that workers clone")
    if urlsplit(url).password is not None:
        raise UserError(f"{REPO_URL_ENV} {shown(url)!r} carries a password, which every deployment would show; give the "
                        "URL without it and let git on the workers authenticate (an SSH key, a credential helper)")
    reached = _git("ls-remote", "--quiet", url, "HEAD")
    if reached.returncode != 0:
        raise UserError(f"{REPO_URL_ENV} {shown(url)!r}: git cannot reach the repository ({_reason(reached, url)})")
    with tempfile.TemporaryDirectory(prefix="karman-pull-check-") as probe:
        _git("init", "--quiet", "--bare", probe)
        # one commit and its trees, no file contents (where the server filters)
        fetched = _git("fetch", "--quiet", "--depth=1", "--filter=blob:none", url, commit, cwd=Path(probe))
        if fetched.returncode != 0:
            raise UserError(f"{REPO_COMMIT_ENV} {commit!r} is not a commit of the repository {shown(url)!r} "
                            f"(push it there first, or name a commit it has)")
        present = _git("ls-tree", "--name-only", commit, "--", *sorted(files), cwd=Path(probe)).stdout.splitlines()
    missing = sorted(files - set(present))
    if missing:
        raise UserError(f"commit {commit} of {shown(url)!r} has no {', '.join(missing)}, which the pools install; "
                        "deploy a commit that has it")


def pull_steps(url: str, commit: str, requirements: str) -> list[dict]:
    """A deployment's pull section: clone ``url`` at ``commit`` into the flow run's working folder, work in the
    clone, pip-install ``requirements`` (a path in the clone) into the worker's Python."""
    return [
        {"prefect.deployments.steps.git_clone": {"repository": url, "commit_sha": commit, "clone_directory_name": CLONE_FOLDER}},
        # relative to the flow run's working folder, where the clone is (a named path: no placeholder to resolve)
        {"prefect.deployments.steps.set_working_directory": {"directory": CLONE_FOLDER}},
        {"prefect.deployments.steps.pip_install_requirements": {"requirements_file": requirements, "stream_output": False}},
    ]


def _checkout_is_at(commit: str, checkout: Path) -> bool:
    head = _git("rev-parse", "HEAD", cwd=checkout).stdout.strip()
    changed = _git("status", "--porcelain", "--untracked-files=no", cwd=checkout).stdout.strip()
    return head == commit and not changed


def requirements_of(deployment: dict) -> str:
    """The requirements file of a deployment's pool (its ``work_pool.requirements``)."""
    requirements = (deployment.get("work_pool") or {}).get("requirements")
    if not isinstance(requirements, str) or not requirements.strip():
        raise UserError(f"deployment {deployment.get('name')!r} ({deployment.get('entrypoint')}) of prefect.yaml: its work_pool names no requirements file "
                        "(work_pool.requirements, e.g. requirements.txt)")
    return requirements.strip()


def with_pull_steps(config: dict, url: str, commit: str) -> dict:
    """prefect.yaml's content with ``pull_steps`` on every deployment and ``work_pool.requirements`` removed
    (Prefect has no such key); ``config`` is left as it is."""
    config = copy.deepcopy(config)
    for deployment in config.get("deployments") or []:
        requirements = requirements_of(deployment)
        # a fresh pool mapping: deployments that share a pool by a YAML alias share one object
        deployment["work_pool"] = {k: v for k, v in deployment["work_pool"].items() if k != "requirements"}
        deployment["pull"] = pull_steps(url, commit, requirements)
    return config


class _PlainDumper(yaml.SafeDumper):
    """Writes every mapping in full where prefect.yaml shared it by an alias."""

    def ignore_aliases(self, data) -> bool:
        return True


def main(argv: list[str]) -> int:
    """Check the repository and commit of ``KARMAN_REPO_URL``/``KARMAN_REPO_COMMIT``, then write PREFECT_YAML
    with pull steps to OUTPUT."""
    name = "infra/deploy.sh"
    if len(argv) != 2:
        print("usage: python -m infra.pull_steps PREFECT_YAML OUTPUT", file=sys.stderr)
        return 2
    source, output = Path(argv[0]), Path(argv[1])
    try:
        url = os.environ.get(REPO_URL_ENV, "")
        commit = resolve_commit(os.environ.get(REPO_COMMIT_ENV, "").strip() or "HEAD", source.resolve().parent)
        config = yaml.safe_load(source.read_text())
        deployed = with_pull_steps(config, url, commit)
        check_repository(url, commit, {requirements_of(d) for d in config.get("deployments") or []})
    except UserError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    output.write_text(yaml.dump(deployed, Dumper=_PlainDumper, sort_keys=False))
    if not _checkout_is_at(commit, source.resolve().parent):
        # the parameter forms come from this checkout's flows, the runs from the commit's
        print(f"{name}: warning: this checkout differs from commit {commit}; the deployments' parameter forms are "
              "read from the checkout", file=sys.stderr)
    print(f"{name}: deployments pull {shown(url)} at {commit}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
