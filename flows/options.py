"""Command-line options generated from a pydantic spec, for every command of ``python -m flows``; imports no Prefect or MLflow.

Each field of a command's spec is one option: ``--field-name``, its choices from a ``Literal``, a
``bool`` a flag (``--no-field-name`` where it defaults to on), a list repeatable or comma-separated,
a mapping KEY=VALUE pairs. Values stay text here: the spec converts and validates them, so bad input
ends with one line naming the option and the value.
"""

import argparse
import types
import typing
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from tasks.common.config.errors import UserError


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports errors in one line (exit code 2)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s namespace for ``argv``; an argument that no option of its command takes ends the process (exit code
    2) in one line naming the command and where its options are listed."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = getattr(args, "command", None)
        parser.exit(2, f"python -m flows {command}: error: unrecognized arguments: {' '.join(unknown)} "
                       f"(python -m flows {command} --help lists its options)\n")
    return args


def _choices(annotation) -> tuple[list[str] | None, Callable[[str], Any], bool]:
    """(choices, converter, is_list) for a field annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _choices(inner[0])
    if origin is list:
        choices, conv, _ = _choices(args[0])
        return choices, conv, True
    if origin is typing.Literal:
        return [str(a) for a in args], str, False
    if annotation in (int, float):
        return None, annotation, False
    return None, str, False


def cli_fields(model: type[BaseModel]) -> dict:
    """The fields that are command-line options: nested models, and mappings of them, are set in the UI, a spec file or code."""
    def nested(annotation) -> bool:
        if typing.get_origin(annotation) is dict:
            return nested(typing.get_args(annotation)[-1])
        return isinstance(annotation, type) and issubclass(annotation, BaseModel)

    return {name: field for name, field in model.model_fields.items() if not nested(field.annotation)}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _help(model: type[BaseModel], field, is_list: bool, default=None) -> str | None:
    """The option's help: the field's description with its default (``default`` where given: a workload's own),
    unless the description states it. A spec whose help is written for the command line (``cli_help_as_written``)
    names only a default that is set, and its lists say themselves how they are given."""
    if not field.description:
        return None
    as_written = getattr(model, "cli_help_as_written", False)
    text = field.description
    default = field.default if default is None else default
    if "(default:" not in text and not field.is_required() and not (as_written and (default is None or default == [])):
        text += f" (default: {default})"
    elif field.is_required():
        text += " (required)"
    return text + (" — comma-separated" if is_list and not as_written else "")


def add_spec_options(parser: argparse.ArgumentParser, model: type[BaseModel], only: set[str] | None = None,
                     defaults: dict | None = None) -> None:
    """One option per command-line field of ``model`` (of those in ``only``, where given); each left None when not given,
    so the spec's default holds (or the request's workload's: ``defaults``, which the help names)."""
    for name, field in cli_fields(model).items():
        if only is not None and name not in only:
            continue
        flag, annotation = _flag(name), field.annotation
        if annotation is bool:
            if field.default is True:  # on by default: the option turns it off
                parser.add_argument("--no-" + flag[2:], dest=name, action="store_false", default=None, help=field.description)
            else:
                parser.add_argument(flag, dest=name, action="store_true", default=None, help=field.description)
            continue
        if typing.get_origin(annotation) is dict:
            parser.add_argument(flag, dest=name, default=None, metavar="KEY=VALUE,...",
                                help=f"{field.description} (default: {','.join(f'{k}={v}' for k, v in field.get_default(call_default_factory=True).items()) or 'none'})")
            continue
        choices, _, is_list = _choices(annotation)
        help_text = _help(model, field, is_list, (defaults or {}).get(name))
        if choices and not is_list:
            parser.add_argument(flag, dest=name, choices=choices, default=None, help=help_text, metavar="{" + ",".join(choices) + "}")
        elif is_list:  # repeated, comma-separated, or both
            parser.add_argument(flag, dest=name, action="append", default=None, help=help_text)
        else:  # a spec may name further spellings of a text option (``cli_aliases``: field -> flags)
            parser.add_argument(flag, *getattr(model, "cli_aliases", {}).get(name, ()), dest=name, default=None, help=help_text)


def option_models(model: type[BaseModel], workload: str | None = None) -> list[type[BaseModel]]:
    """The workloads' options models whose fields are flags of ``model``'s command too (a spec that holds a workload's own
    ``options``: its ``options_kind``): the named workload's, or where the command line names none (or an unknown one, which
    the command refuses when it runs), every workload's of the table."""
    kind = getattr(model, "options_kind", None)
    if kind is None:
        return []
    from tasks.common.config.workload_table import options_model, table

    try:
        found = [options_model(workload, kind)] if workload else [options_model(name, kind) for name in table()]
    except UserError:
        found = [options_model(name, kind) for name in table()]
    return [options for options in found if options is not None]  # a workload without options of that kind adds no flags


def spec_from_args(model: type[BaseModel], args: argparse.Namespace, base: BaseModel | None = None) -> BaseModel:
    """The spec from the command line's options, over ``base``'s values when given; ValidationError or
    UserError for bad input. A workload's options are handed to the spec beside its own fields, as given: the spec takes
    its own workload's and refuses another's."""
    values = base.model_dump(include=base.model_fields_set) if base is not None else {}  # what it gave: the rest stays unset
    flags = {name: field for other in option_models(model) for name, field in cli_fields(other).items()} | cli_fields(model)
    for name, field in flags.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        _, _, is_list = _choices(field.annotation)
        if typing.get_origin(field.annotation) is dict:
            pairs = [item.split("=", 1) for item in value.split(",") if item.strip()]
            if any(len(p) != 2 for p in pairs):
                raise UserError(f"{_flag(name)}: {value!r} is not a list of KEY=VALUE pairs, e.g. cuda=gpu,xla=tpu")
            value = {k.strip(): v.strip() for k, v in pairs}
        elif is_list:
            given, value = value, [v.strip() for given in value for v in given.split(",") if v.strip()]
            if not value and field.default == []:  # an empty list would silently mean the default, which [] stands for
                raise UserError(f"{_flag(name)}: no value in {','.join(given)!r}; give one or more, comma-separated")
        elif isinstance(value, str) and value.lower() == "none" and type(None) in typing.get_args(field.annotation):
            value = None
        values[name] = value
    return model(**values)


def validation_message(exc: ValidationError) -> str:
    """The first error of a spec's validation in one line: the option, what is wrong, the value given."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not isinstance(p, int))
    if not loc:  # a check across options: its message names the values itself
        return err["msg"].removeprefix("Value error, ").rstrip(".")
    return f"{_flag(loc)}: {err['msg'].rstrip('.')} (got {err.get('input')!r})"
