"""What the Prefect UI's run forms show, from the flows' parameter schemas.

What the Prefect UI's run forms show, from the flows' parameter schemas (the schema a deployment
stores, from which the UI draws its form): the fields a user chooses, not those the benchmark sets for
its cells. Validated with the function Prefect's server applies to a deployment's runs."""

import json
import re

import pytest
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools.validation import validate

from flows import pipeline

KEY = "0123456789abcdef"


def _schema(flow) -> dict:
    return parameter_schema(flow).model_dump_for_openapi()


def _shown(schema: dict, model: str) -> list[str]:
    """The fields the form shows for a spec: its schema's ``properties``."""
    return list(schema["definitions"][model]["properties"])


@pytest.mark.parametrize("flow, model", [(pipeline.train, "TrainSpec"), (pipeline.infer, "InferSpec"),
                                         (pipeline.generate, "GenerateSpec"), (pipeline.aggregate, "AggregateSpec")])
def test_the_forms_leave_out_the_fields_the_benchmark_sets(flow, model):
    schema = _schema(flow)
    assert list(schema["properties"]) == ["spec"]  # no parent_run
    assert "cell" not in _shown(schema, model)
    assert "dataset" in _shown(schema, model) or "name" in _shown(schema, model)


@pytest.mark.parametrize("flow, model, spec", [(pipeline.train, "TrainSpec", {"batch_sizes": [4]}),
                                               (pipeline.infer, "InferSpec", {"model_run": "f" * 32})])
def test_the_server_still_takes_and_checks_a_cells_fields(flow, model, spec):
    schema = _schema(flow)
    assert "resume" in _shown(schema, model) or model == "InferSpec"  # a user's choice stays
    # what the benchmark sends to a cell's deployment
    validate({"spec": {**spec, "cell": KEY}, "parent_run": "a" * 32}, schema, raise_on_error=True)
    validate({"spec": {**spec, "cell": None}}, schema, raise_on_error=True)  # the form's default
    with pytest.raises(Exception, match="'not-a-key' does not match"):
        validate({"spec": {**spec, "cell": "not-a-key"}}, schema, raise_on_error=True)
    with pytest.raises(Exception, match="celll"):  # unknown fields stay refused
        validate({"spec": {**spec, "celll": KEY}}, schema, raise_on_error=True)


def test_the_flow_itself_still_validates_them():
    from pydantic import ValidationError

    from tasks.common.specs import TrainSpec

    assert TrainSpec(cell=KEY).cell == KEY
    with pytest.raises(ValidationError):
        TrainSpec(cell="not-a-key")
    # the JSON schema of the spec keeps the field for validation, out of the form's list
    schema = TrainSpec.model_json_schema()
    assert "cell" not in schema["properties"] and "^cell$" in schema["patternProperties"]
    assert json.dumps(schema).count("x-karman-internal") == 0


def _descriptions(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["description"]] if isinstance(node.get("description"), str) else []
        return own + [d for value in node.values() for d in _descriptions(value)]
    if isinstance(node, list):
        return [d for value in node for d in _descriptions(value)]
    return []


@pytest.mark.parametrize("name", ["generate", "train", "infer", "aggregate", "benchmark", "demo", "validate_solver", "ablate"])
def test_every_description_renders_as_written(name):
    """The UI renders descriptions as Markdown with HTML: ``<data root>`` would vanish as a tag."""
    found = _descriptions(_schema(getattr(pipeline, name)))
    assert found
    assert [d for d in found if re.search(r"<[A-Za-z/!?]", d)] == []
