"""Every registered workload, the toy one included, keeps the contracts the stages rely on.

Its parts callable as they are called, its frameworks in the framework table, each framework module's ``build`` and
the trainer class it returns with every member of the loop's Trainer, each of bench-frameworks' reference modules it
declares with what the bench calls and none it does not declare; and no workload's trainer is another workload's."""

import dataclasses
import importlib
import inspect
import typing
from pathlib import Path

import pytest

from tasks.common.runtimes import loop
from tasks.common.config.errors import UserError
from tasks.workloads import Workload, framework_module, get_workload, reference_module, table
from tasks.workloads.contract import HOOKS, Check, conforms

TOY = "toy=tests.workloads.toy"


@pytest.fixture
def every_workload(monkeypatch) -> list[str]:
    monkeypatch.setenv("KARMAN_WORKLOADS", TOY)
    return sorted(table())


def trainer_class(module) -> type:
    return typing.get_type_hints(module.build)["return"]


def test_every_workload_and_framework_module_keeps_its_contract(every_workload):
    assert {"karman", "digits", "har", "calo", "toy"} <= set(every_workload)
    for name in every_workload:
        workload = get_workload(name)  # its parts' signatures checked as it is made
        assert isinstance(workload, Workload) and workload.name == name
        typed = typing.get_type_hints(Workload)
        for part, hook in HOOKS.items():  # each hook field typed by its Protocol, and the workload's part standing for it
            assert hook in (typing.get_args(typed[part]) or (typed[part],)), part
            if getattr(workload, part) is not None:
                conforms(getattr(workload, part), hook, f"{name}.{part}")
        for part in ("prepare", "check", "dataset_info", "setting"):  # the hooks every workload has are annotated, and with the hook's types
            assert "spec" in typing.get_type_hints(getattr(workload, part)) or part == "dataset_info", (name, part)
        for framework in workload.frameworks:
            module = framework_module(workload, framework)
            cls = trainer_class(module)
            methods = [m for m in loop.protocol_members(loop.Trainer) if callable(getattr(loop.Trainer, m, None))]
            assert not [m for m in methods if not callable(getattr(cls, m, None))], (name, framework, cls)
            # a trainer builds on a shared base of its own framework or the workload's own, never on another workload's trainer
            foreign = [base.__module__ for base in inspect.getmro(cls)
                       if base.__module__.startswith(("tasks.workloads.", "tests.workloads."))
                       and not base.__module__.startswith(module.__name__.rpartition(".")[0] + ".")]
            assert not foreign, (name, framework, foreign)
        for framework in workload.references:  # bench-frameworks' idiomatic references: each with what the bench calls (REFERENCE)
            reference_module(workload, framework)
        folder = Path(importlib.import_module(table()[name]).__file__).parent / "references"
        assert sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__") == sorted(workload.references), name


def test_trainer_protocol_names_what_a_trainer_lacks():
    members = loop.protocol_members(loop.Trainer)
    assert {"samples", "params", "speed", "batches", "step", "evaluate", "finish", "state", "load_state"} <= set(members)

    class Partial:
        samples, has_validation, headline, flops_per_sample, params, speed = 8, True, {}, 1.0, {}, {}

        def batches(self, epoch, steps): ...
        def step(self, batch, flags, progress): ...

    lacking = loop.missing_members(Partial(), loop.Trainer)
    assert "finish" in lacking and "evaluate" in lacking and "samples" not in lacking and "step" not in lacking
    assert not isinstance(Partial(), loop.Trainer)


def test_a_workload_whose_part_does_not_fit_is_refused_when_made():
    digits = get_workload("digits")
    with pytest.raises(TypeError, match=r"workload digits: check takes 2 positional argument\(s\); the stages call it with \(settings, spec, batch_sizes, world, memory\)"):
        dataclasses.replace(digits, check=lambda settings, spec: None)

    def typed_wrongly(settings, spec: str, batch_sizes, world, memory=None) -> None: ...

    with pytest.raises(TypeError, match=r"workload digits: check: its parameter spec is annotated <class 'str'>, where the stages pass <class 'tasks.common.specs.TrainSpec'>"):
        dataclasses.replace(digits, check=typed_wrongly)

    def wants_more(settings, spec, batch_sizes, world, memory, extra) -> None: ...

    with pytest.raises(TypeError, match="workload digits: check needs more arguments than the stages give it"):
        dataclasses.replace(digits, check=wants_more)
    conforms(lambda *anything: None, Check, "takes anything")  # a part that takes more by position stands for the hook
    with pytest.raises(TypeError, match="workload digits: frameworks mxnet are not in the framework table"):
        dataclasses.replace(digits, frameworks=("torch", "mxnet"))
    with pytest.raises(TypeError, match="workload digits: setting is str"):
        dataclasses.replace(digits, setting="widths")


def test_a_framework_module_without_build_is_refused(monkeypatch, tmp_path):
    package = tmp_path / "brokenload"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "torch.py").write_text("def build(data, spec):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KARMAN_WORKLOADS", "brokenload=brokenload")
    broken = dataclasses.replace(get_workload("digits"), name="brokenload", frameworks=("torch",), references=())
    with pytest.raises(TypeError, match=r"brokenload.torch.build takes 2 positional argument\(s\); the stages call it with \(data, spec, batch_size, runtime\)"):
        framework_module(broken, "torch")
    importlib.invalidate_caches()


def test_a_workload_without_references_or_a_reference_module_that_does_not_fit_is_refused(monkeypatch, tmp_path):
    with pytest.raises(UserError, match="workload calo has no torch reference for bench-frameworks; digits, har, karman have references"):
        reference_module(get_workload("calo"), "torch")
    with pytest.raises(TypeError, match="workload digits: references mxnet are not among its frameworks"):
        dataclasses.replace(get_workload("digits"), references=("mxnet",))
    package = tmp_path / "brokenrefs"
    (package / "references").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "references" / "__init__.py").write_text("")
    (package / "references" / "torch.py").write_text("class Reference:\n    def __init__(self, spec, weights, x, y, batch_size): ...\n\n"
                                                     "def arrays(data): ...\n\ndef ours_weights(trainer): ...\n\ndef ours_loss(trainer, x): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KARMAN_WORKLOADS", "brokenrefs=brokenrefs")
    broken = dataclasses.replace(get_workload("digits"), name="brokenrefs", references=("torch",))
    with pytest.raises(TypeError, match=r"brokenrefs.references.torch.ours_loss cannot be called with \(trainer, x, y\)"):
        reference_module(broken, "torch")
    importlib.invalidate_caches()
