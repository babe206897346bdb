"""Each workload owns its options, on the command line, in a spec and in a benchmark.

A request of another workload that sets one is refused in one line naming whose it is and the workload's own; the
command line's help for a workload shows its options and none of another's; a benchmark's sections, which hold every
workload's options, give each workload's cells its own only."""

import pytest

from tasks.common.config.errors import UserError
from tasks.common.specs import BenchmarkSpec, GenerateSpec, TrainSpec
from pydantic import ValidationError

from flows.options import validation_message
from tasks.workloads import check_benchmark_options, get_workload, option_owners, with_own_defaults
from tests.conftest import run_in_process
from tests.flows.test_cli import assert_refused


def test_each_workload_declares_its_own_options_and_the_shared_spec_none_of_them():
    train, generate = option_owners(), option_owners("generate")
    assert not set(train) & set(TrainSpec.model_fields) and not set(generate) & set(GenerateSpec.model_fields)
    assert train["recipe"] == ["karman"] and train["layers"] == ["har"] and train["target_accuracy"] == ["digits"]
    assert generate["events"] == ["calo"] and generate["reynolds"] == ["karman"]
    assert len(TrainSpec.model_fields) <= 20  # the settings every workload's runs share, and its ``options``
    har = TrainSpec(workload="har", layers=3)
    assert set(har.options.model_fields) == {"layers", "units", "schedule"} and (har.options.layers, har.options.units) == (3, None)


@pytest.mark.parametrize(("values", "words"), [
    ({"workload": "har", "recipe": "paper"}, "workload har takes no --recipe (karman's option); its own options are --layers, --units"),
    ({"workload": "digits", "layers": 3}, "workload digits takes no --layers (har's option); its own options are --target-accuracy"),
    ({"workload": "calo", "target_accuracy": 0.9}, "workload calo takes no --target-accuracy (digits's option); it has no options of its own"),
    ({"workload": "karman", "units": 8}, "workload karman takes no --units (har's option); its own options are --validate-steps"),
    ({"workload": "har", "options": {"ngf": 8}}, "1 validation error"),  # given where only its own options go: refused as unknown
])
def test_another_workloads_training_option_is_refused_naming_whose_it_is(values, words):
    with pytest.raises(ValidationError) as caught:
        TrainSpec(**values)
    message = validation_message(caught.value) if not words.startswith("1 ") else str(caught.value)
    assert message.startswith(words) and ("\n" not in message or words.startswith("1 "))


@pytest.mark.parametrize(("values", "words"), [
    ({"workload": "calo", "nx": 300}, "workload calo takes no --nx (karman's option); its own options are --events, --energy, --angle"),
    ({"workload": "karman", "events": 300}, "workload karman takes no --events (calo's option)"),
    ({"workload": "digits", "source": "synthetic"}, "workload digits takes no --source (har's option); it has no options of its own"),
])
def test_another_workloads_generate_option_is_refused_naming_whose_it_is(values, words):
    with pytest.raises(ValidationError) as caught:
        GenerateSpec(**values)
    assert validation_message(caught.value).startswith(words) and "\n" not in validation_message(caught.value)


def test_own_options_and_defaults_pass_and_records_of_one_flat_spec_still_open():
    assert TrainSpec(workload="har", layers=3, units=16, epochs=2).options.units == 16
    assert TrainSpec(workload="karman", recipe="paper", crop=64).options.resolved_recipe().name.startswith("paper")
    assert TrainSpec(workload="digits", target_accuracy=0.9).options.target_accuracy == 0.9
    assert GenerateSpec(workload="calo", events=300).options.events == 300
    assert GenerateSpec(workload="karman", reynolds=[100.0]).options.reynolds == [100.0]
    # a spec as records, deployments and spec files held it when one flat spec held every workload's options
    flat = {"workload": "har", "layers": 2, "units": None, "recipe": "default", "ngf": None, "target_vorticity": 0.3, "cuda_graph": "auto",
            "target_accuracy": None, "schedule": None, "batch_sizes": [64]}
    har = TrainSpec.model_validate(flat)
    assert har.options.model_dump() == {"layers": 2, "units": None, "schedule": None}
    assert TrainSpec.model_validate(har.model_dump()) == har  # and its new form round-trips


def test_a_benchmark_gives_each_workloads_cells_their_own_options():
    from flows.matrix import benchmark_matrix, train_cell

    bench = BenchmarkSpec(workloads=["karman", "calo"], generate={"events": 300}, train={"recipe": "paper", "layers": 3})
    cells = {m.workload.name: m for m in benchmark_matrix(bench)}
    karman_data, calo_data = cells["karman"].generate, cells["calo"].generate
    assert not hasattr(karman_data.options, "events") and calo_data.options.events == 300 and calo_data.dataset == "calo-events300"
    assert bench.generate.options["calo"].events == 300  # a flat option goes to the workload that has it
    calo_cell = train_cell(cells["calo"].train, "cpu", 8, 0, "torch", "calo", "calo")
    karman_cell = train_cell(cells["karman"].train, "cpu", 8, 0, "torch", "karman")
    assert calo_cell.options.model_dump() == {} and (karman_cell.options.recipe, type(karman_cell.options).__name__) == ("paper", "KarmanOptions")
    assert bench.train.options["har"].layers == 3  # a flat option goes to the workloads that have it


def test_a_benchmark_option_none_of_its_workloads_takes_is_refused_unless_its_preset_set_it(workdir):
    from tasks.workloads.presets import quick_benchmark

    with pytest.raises(UserError, match=r"^train\.layers = 3 is har's option; no workload of this benchmark \(karman, calo\) takes it"):
        check_benchmark_options(BenchmarkSpec(workloads=["karman", "calo"], train={"layers": 3}))
    with pytest.raises(UserError, match=r"^generate\.events = 300 is calo's option; .* \(digits\) takes it: add calo to its workloads"):
        check_benchmark_options(BenchmarkSpec(workloads=["digits"], generate={"events": 300}))
    check_benchmark_options(BenchmarkSpec(workloads=["har", "calo"], train={"layers": 3}, generate={"events": 300}))
    # the matrix's own sweep of har's sizes, too (each cell would drop it: before, a karman benchmark ran without a word)
    with pytest.raises(UserError, match=r"^--units 16,32 sweeps har's option; no workload of this benchmark \(karman\) takes it"):
        check_benchmark_options(BenchmarkSpec(workloads=["karman"], units=[16, 32]))
    check_benchmark_options(BenchmarkSpec(workloads=["karman", "har"], layers=[1, 2], units=[16]))
    quick = quick_benchmark()  # the preset's karman widths and calo events stay out of a digits-only quick run's way
    check_benchmark_options(quick.model_copy(update={"workloads": ["digits"]}), quick)
    with pytest.raises(UserError, match=r"^train\.ngf = 16 is karman's option"):  # the same values given by hand
        check_benchmark_options(quick.model_copy(update={"workloads": ["digits"]}))
    (workdir / "har.json").write_text('{"workloads": ["har"], "train": {"ngf": 8}}')
    assert_refused(run_in_process("benchmark", "--spec", "har.json", cwd=workdir),
                   "train.ngf = 8 is karman's option; no workload of this benchmark (har) takes it")
    assert_refused(run_in_process("benchmark", "--workloads", "karman", "--layers", "2", cwd=workdir),
                   "--layers 2 sweeps har's option; no workload of this benchmark (karman) takes it")


def test_the_command_line_shows_and_refuses_by_workload(workdir):
    shown = run_in_process("train", "--workload", "har", "--help", cwd=workdir)
    assert shown.returncode == 0 and "--layers" in shown.stdout and "--units" in shown.stdout
    assert not {"--recipe", "--crop", "--target-vorticity", "--val-simulations", "--target-accuracy"} & set(shown.stdout.split())
    every = run_in_process("train", "--help", cwd=workdir)
    assert "--recipe" in every.stdout and "--layers" in every.stdout
    calo = run_in_process("generate", "--workload=calo", "--help", cwd=workdir)
    assert "--events" in calo.stdout and "--reynolds" not in calo.stdout
    assert_refused(run_in_process("train", "--workload", "har", "--dataset", "har", "--recipe", "paper", cwd=workdir),
                   "workload har takes no --recipe (karman's option)", "--layers, --units")
    assert not (workdir / "data").exists()  # the data root the refused command made for itself is gone again
    # refused for what it gave, not for a check of karman's recipe that the option failed (target_steps 40 > 10)
    assert_refused(run_in_process("train", "--workload", "digits", "--validate-steps", "10", cwd=workdir),
                   "workload digits takes no --validate-steps (karman's option)")
    # an option's own error is named as before, also beside another workload's option given at its default
    assert_refused(run_in_process("train", "--workload", "har", "--recipe", "default", "--batch-sizes", "0", cwd=workdir),
                   "--batch-sizes: Input should be greater than 0")
    assert_refused(run_in_process("generate", "--workload", "calo", "--dataset", "showers", "--nx", "300", cwd=workdir),
                   "workload calo takes no --nx (karman's option)")


def test_what_a_request_leaves_out_is_its_workloads_own_and_what_it_gives_stays():
    """A digits, har or calo request trains on and writes its own dataset at its own batch size and epochs, as a
    benchmark's cell does; karman's are the spec's defaults, so a karman spec comes back as it was (its cells' keys too)."""
    for name in ("digits", "har", "calo"):
        workload = get_workload(name)
        own = with_own_defaults(TrainSpec(workload=name))
        assert (own.dataset, own.batch_sizes, own.epochs) == (workload.dataset, [workload.batch_sizes[0]], workload.epochs) == (name, [64], own.epochs)
        assert with_own_defaults(GenerateSpec(workload=name)).dataset == name
    assert (with_own_defaults(TrainSpec(workload="digits")).epochs, with_own_defaults(TrainSpec(workload="har")).epochs) == (8, 12)
    for spec in (TrainSpec(), TrainSpec(workload="karman", batch_sizes=[16]), GenerateSpec(),
                 TrainSpec(workload="digits", dataset="d", batch_sizes=[8], epochs=2),
                 TrainSpec.model_validate(TrainSpec(workload="har").model_dump())):  # a whole spec, as a record or a cell holds it
        assert with_own_defaults(spec) is spec
    budget = with_own_defaults(TrainSpec(workload="digits", time_budget=30))
    assert (budget.epochs, budget.dataset) == (None, "digits")  # a time budget sets the length: no epoch limit added
    resumed = TrainSpec(workload="digits", resume="0" * 32)
    assert with_own_defaults(resumed) is resumed  # the stored run's own, read when it resumes


def test_the_help_names_the_workloads_own_defaults(workdir):
    def shown(*args):  # the help, its lines as argparse wrapped them joined again
        return " ".join(run_in_process(*args, "--help", cwd=workdir).stdout.split())

    digits = shown("train", "--workload", "digits")
    assert "(default: digits)" in digits and "(default: [64])" in digits and "(default: 8)" in digits
    karman = shown("train")
    assert "(default: karman-demo)" in karman and "(default: [8])" in karman
    assert "(default: calo)" in shown("generate", "--workload", "calo")
