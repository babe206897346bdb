"""A wheelhouse for a GPU node that reaches no package index: the pool's wheels, less those the node already has.

On a connected machine, ``python -m infra.wheelhouse OUT_DIR`` has pip download (dependencies resolved by
pip) the binary wheels that ``--requirements`` (default requirements-gpu-pool.txt) needs on CPython
``--python`` (default 3.12) for manylinux x86-64, then drops the wheels of distributions the node already
has (``--have``: the node's ``pip list --format=freeze``, ``name==version`` or bare ``name`` lines, names
compared as PEP 503 normalises them; infra/gpu-node-packages.txt for this workplace's GPU machines), except
those the requirements file names itself, and those whose version on the node (where ``--have`` gives
it) is outside what a kept wheel requires (prefect 3.8.8 needs python-dateutil<3: a node with 4.0.0 gets
2.9.0 from the wheelhouse). It prints one line per wheel kept and their total size. The wheels go to a
temporary folder beside OUT_DIR, which is made (or filled, where it is an empty folder) only at the end.
Bad input: one line, exit 2, nothing written.

    python -m infra.wheelhouse .whl --python 3.12 --have infra/gpu-node-packages.txt

On the node, offline, into the Python that holds its torch (a venv with ``--system-site-packages`` made from
that Python would see the base interpreter's packages, not its torch):

    python3 -m pip install --no-index --find-links .whl -r requirements-gpu-pool.txt
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tasks.common.config.errors import UserError

NAME = "python -m infra.wheelhouse"
# manylinux x86-64, newest first: pip takes a platform only as named (it does not widen manylinux_2_28 to
# older glibc), so each is listed; a node with glibc 2.28 or newer installs all of them
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64")
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def normalise(name: str) -> str:
    """A distribution's name as PEP 503 compares it: lower case, runs of ``-``, ``_`` and ``.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_have(text: str, source: str = "--have") -> dict[str, str | None]:
    """The distributions of a ``pip list --format=freeze`` (or ``pip freeze``) listing, by normalised name,
    each with its version where the line pins one (``name==version``), else None (``name @ url``, a bare
    ``name``); blank lines, ``#`` comments and ``-`` options are skipped. UserError, naming the line, for
    one that starts with no name."""
    found: dict[str, str | None] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = _NAME.match(line)
        rest = line[match.end():].lstrip() if match else line
        if not match or (rest and not rest.startswith(("==", "===", "@", "[", ";", "<", ">", "~", "!"))):
            raise UserError(f"{source} line {number} {line!r} is not 'name==version' or a bare distribution name")
        version = re.fullmatch(r"(?:\[[^\]]*\])?\s*===?\s*([^\s;,]+)", rest)
        found[normalise(match.group())] = version.group(1) if version else None
    return found


def read_pins(text: str) -> set[str]:
    """The normalised names of the distributions a requirements file names (its options and comments skipped)."""
    return set(read_have(text, "--requirements"))


def wheel_distribution(filename: str) -> str:
    """The normalised distribution name of a wheel file (``zarr-3.1.6-py3-none-any.whl``: ``zarr``)."""
    return normalise(filename.split("-", 1)[0])


def select(wheels: list[str], have: dict[str, str | None] | set[str], pins: set[str]) -> tuple[list[str], list[str]]:
    """(kept, dropped) wheel file names: a wheel is dropped where the node has its distribution and the
    requirements file does not name it."""
    kept, dropped = [], []
    for wheel in sorted(wheels):
        name = wheel_distribution(wheel)
        (dropped if name in have and name not in pins else kept).append(wheel)
    return kept, dropped


def requires(wheel: Path, python: str) -> list[tuple[str, object]]:
    """(normalised name, specifier) of what a wheel's METADATA requires on CPython ``python`` on Linux x86-64
    (requirements of its extras and of other platforms left out)."""
    from packaging.requirements import Requirement

    environment = {"python_version": python, "python_full_version": f"{python}.0", "implementation_name": "cpython",
                   "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
                   "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA") and name.count("/") == 1)
        lines = archive.read(metadata).decode("utf-8", "replace").splitlines()
    found = []
    for line in lines:
        if not line.strip():
            break  # the headers end at the first blank line
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            if requirement.marker is None or requirement.marker.evaluate(environment):
                found.append((normalise(requirement.name), requirement.specifier))
    return found


def keep_unmet(folder: Path, kept: list[str], dropped: list[str], have: dict[str, str | None], python: str) -> tuple[list[str], list[str], list[str]]:
    """(kept, dropped, why) after keeping the dropped wheels of node distributions whose version (where
    ``have`` gives it) does not satisfy what a kept wheel requires: offline, pip could not install that
    kept wheel beside the node's copy. An unknown version is taken as satisfying."""
    from packaging.version import InvalidVersion, Version

    kept, dropped, why = list(kept), list(dropped), []
    checked: set[str] = set()
    while pending := [wheel for wheel in kept if wheel not in checked]:
        for wheel in pending:
            checked.add(wheel)
            for name, specifier in requires(folder / wheel, python):
                if not have.get(name):
                    continue
                try:
                    version = Version(have[name])
                except InvalidVersion:
                    continue
                backup = next((w for w in dropped if wheel_distribution(w) == name), None)
                if backup and not specifier.contains(version, prereleases=True):
                    dropped.remove(backup)
                    kept.append(backup)
                    why.append(f"kept {backup}: the node's {name} {version} is outside {wheel_distribution(wheel)}'s {name}{specifier}")
    return sorted(kept), dropped, why


def download_command(requirements: Path, python: str, dest: Path) -> list[str]:
    """pip download of the binary wheels ``requirements`` needs on CPython ``python`` for manylinux x86-64."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            *platforms, "--dest", str(dest), "--disable-pip-version-check", "--quiet", "-r", str(requirements)]


def _read(option: str, path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise UserError(f"{option} {str(path)!r} cannot be read ({reason}); give a readable text file") from None


def check(out: Path, python: str, requirements: Path, have: Path | None) -> tuple[set[str], dict[str, str | None]]:
    """(pins, have) read from the arguments; UserError for a bad one, before anything is written."""
    if not re.fullmatch(r"3\.\d{1,2}", python):
        raise UserError(f"--python {python!r} must be a Python version MAJOR.MINOR, like 3.12 (CPython 3 only)")
    pins = read_pins(_read("--requirements", requirements))
    if not pins:
        raise UserError(f"--requirements {str(requirements)!r} names no distribution")
    names = read_have(_read("--have", have), f"--have {str(have)!r}") if have is not None else {}
    if out.exists() and not out.is_dir():
        raise UserError(f"OUT_DIR {str(out)!r} is a file; name a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"OUT_DIR {str(out)!r} is not empty; name a new or empty folder")
    if not out.absolute().parent.is_dir():
        raise UserError(f"OUT_DIR {str(out)!r}: its parent folder does not exist")
    return pins, names


def build(out: Path, python: str, requirements: Path, have: Path | None) -> list[Path]:
    """Download, select and move the kept wheels into ``out``; the kept wheels' paths. UserError for bad
    input (nothing written), RuntimeError where pip fails (nothing written)."""
    pins, names = check(out, python, requirements, have)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.absolute().parent))
    print(f"downloading the wheels of {requirements} for CPython {python}, manylinux x86-64 (pip download) ...", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(download_command(requirements, python, staging), stdout=sys.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"pip download failed (exit {done.returncode}); its message is above")
        kept, dropped = select([path.name for path in staging.glob("*.whl")], names, pins)
        kept, dropped, why = keep_unmet(staging, kept, dropped, names, python)
        for line in why:
            print(line, file=sys.stderr)
        for wheel in dropped:
            (staging / wheel).unlink()
        for other in staging.iterdir():  # pip leaves only wheels with --only-binary; anything else goes
            if other.name not in kept:
                shutil.rmtree(other) if other.is_dir() else other.unlink()
        if dropped:
            print(f"left out {len(dropped)} wheels the node has: {', '.join(wheel_distribution(w) for w in dropped)}", file=sys.stderr)
        if out.is_dir():
            out.rmdir()  # empty (checked): the staging folder takes its place
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [out / wheel for wheel in kept]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"{NAME}: error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str]) -> int:
    parser = _Parser(prog=NAME, description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("out", metavar="OUT_DIR", type=Path, help="a new or empty folder for the wheels")
    parser.add_argument("--python", default="3.12", help="the node's Python version, MAJOR.MINOR (default 3.12)")
    parser.add_argument("--have", type=Path, metavar="NODE_FREEZE.txt",
                        help="the node's pip list --format=freeze (or bare names): their wheels are left out")
    parser.add_argument("--requirements", type=Path, default=Path("requirements-gpu-pool.txt"),
                        help="the pool's requirements file (default requirements-gpu-pool.txt)")
    args = parser.parse_args(argv)
    try:
        wheels = build(args.out, args.python, args.requirements, args.have)
    except UserError as exc:
        print(f"{NAME}: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"{NAME}: error: {exc}", file=sys.stderr)
        return 1
    total = 0
    for wheel in wheels:
        size = wheel.stat().st_size
        total += size
        print(f"{size / 1e6:8.2f} MB  {wheel.name}")
    print(f"{total / 1e6:8.2f} MB  in all: {len(wheels)} wheels in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
