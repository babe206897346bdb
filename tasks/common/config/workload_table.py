"""The workload table: each workload's name and the package of its folder, and the typed options its folder declares.

Adding a workload is its folder and one line here. Workloads kept outside this repository join through
``KARMAN_WORKLOADS=name=package.module,...`` (child processes inherit it). A workload's package is imported by its
name only when a request names it, so that this module, which the specs validate through, imports none of them.
"""

import importlib
import os

from tasks.common.config.errors import UserError

# name -> the package of its folder
WORKLOADS: dict[str, str] = {
    "karman": "tasks.workloads.karman",
    "digits": "tasks.workloads.digits",
    "har": "tasks.workloads.har",
    "calo": "tasks.workloads.calo",
}
EXTRA_ENV = "KARMAN_WORKLOADS"
DEFAULT_WORKLOAD = "karman"  # a request's when it names none, and a record's logged before runs named theirs


def table() -> dict[str, str]:
    """The workloads known in this process: the table and those named in KARMAN_WORKLOADS."""
    extra = {}
    for item in filter(None, (part.strip() for part in os.environ.get(EXTRA_ENV, "").split(","))):
        name, _, module = item.partition("=")
        if not name or not module:
            raise UserError(f"{EXTRA_ENV}: {item!r} is not name=package.module")
        extra[name.strip()] = module.strip()
    return WORKLOADS | extra


def package_of(name: str) -> str:
    """The package of workload ``name``'s folder; UserError listing the valid names for any other."""
    known = table()
    if name not in known:
        raise UserError(f"unknown workload {name!r}; choose one of {', '.join(sorted(known))}")
    return known[name]


KINDS = {"train": "TRAIN", "generate": "GENERATE"}  # a kind of request -> the name its options model has in a workload's options.py


def options_model(name: str, kind: str = "train"):
    """The typed options of workload ``name``'s training runs (``kind`` "train": its folder's ``options.TRAIN``) or generate
    requests ("generate": ``options.GENERATE``; None where a workload declares none: it takes no generate options), each a
    subclass of tasks.common.specs.WorkloadOptions; UserError for an unknown name or a folder that declares no training options."""
    module = importlib.import_module(f"{package_of(name)}.options")
    model = getattr(module, KINDS[kind], None)
    if model is None and kind == "train":
        raise UserError(f"workload {name}: {module.__name__} declares no TRAIN options model")
    return model


def padding_of_others(name: str, kind: str = "train") -> dict:
    """What the one flat spec of earlier versions held of the other workloads' options of ``kind`` (each model's
    ``key_padding``), for a key of workload ``name``'s that must stay as it was (a cell's, a sweep's)."""
    padding: dict = {}
    for other in table():
        if other != name and (model := options_model(other, kind)) is not None:
            padding |= model.key_padding()
    return padding


def option_owners(kind: str = "train") -> dict[str, list[str]]:
    """option name -> the workloads of this process's table whose options of ``kind`` have it."""
    found: dict[str, list[str]] = {}
    for name in table():
        for option in getattr(options_model(name, kind), "model_fields", ()):
            found.setdefault(option, []).append(name)
    return found
