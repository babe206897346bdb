"""The step recorded as CUDA graphs: its warm-up undone exactly, its learning rate a tensor that schedules and resumes change in place, its defaults per device, and (on a GPU) the same training as the eager step."""

import copy

import pytest
import torch

from models.device import resolve_device
from models.karman.nets.config import NetConfig
from models.karman.nets.trainer import CapturedSteps, OptimConfig, Pix2Pix, build_trainer, speed_options
from tasks.bench.specs import BenchTrainSpec
from tasks.common.specs import TrainSpec

NET = NetConfig(in_channels=4, out_channels=3, size=32, ngf=4, ndf=4, dropout=0.0)


def _batch(seed: int, unroll: int = 2, size: int = 32):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(2, 4, size, size, generator=gen) * 2 - 1, torch.rand(2, 3 * unroll, size, size, generator=gen) * 2 - 1


def test_the_warm_up_steps_are_undone_weights_statistics_and_optimiser_state_alike():
    """What CapturedSteps does around recording: after eager steps, every weight, batch-norm statistic and
    optimiser moment is as before them, and the optimiser state the steps created is zero again (a first step's)."""
    torch.manual_seed(0)
    model = Pix2Pix(NET, OptimConfig(unroll=2, fused=True))
    cond, target = _batch(0)
    model.eager_step(cond, target, resolve_device("cpu").autocast)  # one step: the optimiser has state to keep
    captured = CapturedSteps(model, "fp32")
    with torch.no_grad():
        saved = {id(t): (t, t.detach().clone()) for t in captured._state()}
    before = [t.detach().clone() for t in captured._state()]
    for seed in (1, 2, 3):
        model.eager_step(*_batch(seed), resolve_device("cpu").autocast)
    moved = [t for t, b in zip(captured._state(), before) if not torch.equal(t, b)]
    assert moved  # the steps changed weights and moments
    captured._restore(saved)
    after = captured._state()
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))

    fresh = Pix2Pix(NET, OptimConfig(fused=True))
    captured = CapturedSteps(fresh, "fp32")
    with torch.no_grad():
        saved = {id(t): (t, t.detach().clone()) for t in captured._state()}
    fresh.eager_step(*_batch(4, unroll=1), resolve_device("cpu").autocast)
    created = [t for opt in (fresh.opt_g, fresh.opt_d) for s in opt.state.values() for t in s.values()]
    assert created and any(t.abs().sum() > 0 for t in created)
    captured._restore(saved)
    assert all(float(t.abs().sum()) == 0.0 for t in created)


def test_a_capturable_optimiser_keeps_its_rate_tensor_through_schedules_and_loading():
    """A graph reads the learning rate from the tensor it recorded: set_lr_factor fills it, and loading a
    checkpoint's optimiser state writes the loaded rate into it rather than replacing it."""
    model = Pix2Pix(NET, OptimConfig(lr=2e-4, fused=True))
    model.make_optimizers(capturable=True)
    rates = [g["lr"] for opt in (model.opt_g, model.opt_d) for g in opt.param_groups]
    assert all(isinstance(r, torch.Tensor) for r in rates) and rates[0] is not rates[1]
    model.set_lr_factor(0.25)
    assert all(float(r) == pytest.approx(5e-5) for r in rates)
    state = copy.deepcopy(model.optimizer_state())  # as a checkpoint holds it: a copy
    model.set_lr_factor(1.0)
    model.load_optimizer_state(state)
    now = [g["lr"] for opt in (model.opt_g, model.opt_d) for g in opt.param_groups]
    assert all(a is b for a, b in zip(now, rates)) and all(float(r) == pytest.approx(5e-5) for r in now)


def test_cuda_records_the_step_and_other_devices_refuse_it_in_one_line():
    assert speed_options("cuda")["cuda_graph"] is True and speed_options("cuda")["compile"] is False
    assert speed_options("cpu")["cuda_graph"] is False and speed_options("cuda", cuda_graph="off")["cuda_graph"] is False
    with pytest.raises(ValueError, match="^cuda_graph on records the step on a CUDA GPU; device 'cpu' has none \\(choose auto or off\\)$"):
        speed_options("cpu", cuda_graph="on")
    with pytest.raises(ValueError, match="cuda_graph on records the step on a CUDA GPU; device 'cpu' has none"):
        TrainSpec(workload="karman", cuda_graph="on")
    with pytest.raises(ValueError, match="cuda_graph on records the step on a CUDA GPU; device 'cpu' has none"):
        BenchTrainSpec(cuda_graph="on")  # bench-train refuses it as train does, before any child starts
    model = build_trainer(NET, OptimConfig(), resolve_device("cpu"), speed_options("cpu"))
    assert model.captured is None and not isinstance(model.opt_g.param_groups[0]["lr"], torch.Tensor)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_graphed_steps_train_as_the_eager_ones():
    """Two trainers from one seed, dropout off, four steps of a two-step unrolled loss on the same batches and a
    learning rate halved after the first: the same weights within cuDNN's differences between algorithms."""
    ctx = resolve_device("cuda")
    trained = []
    for graph in ("off", "on"):
        torch.manual_seed(0)
        model = build_trainer(NET, OptimConfig(unroll=2), ctx, speed_options("cuda", "fp32", compile="off", cuda_graph=graph))
        assert (model.captured is not None) == (graph == "on")
        for n in range(4):
            model.set_lr_factor(1.0 if n == 0 else 0.5)
            cond, target = (t.cuda().contiguous(memory_format=torch.channels_last) for t in _batch(n))
            model.train_step(cond, target, ctx.autocast, None, 2)
        torch.cuda.synchronize()
        trained.append(model)
    eager, graphed = trained
    assert len(graphed.captured.graphs) == 1
    for a, b in zip(list(eager.parameters()) + list(eager.buffers()), list(graphed.parameters()) + list(graphed.buffers())):
        assert float((a.float() - b.float()).norm()) <= 1e-3 * float(a.float().norm()) + 1e-6


def test_a_cells_key_leaves_the_graph_choice_out_at_its_default_and_keeps_it_otherwise():
    """cuda_graph came after cells were keyed: at auto a cell keeps the key it had; a choice made is a different cell."""
    from tasks.common.tracking.cells import cell_key

    spec = TrainSpec(workload="karman", device="cuda")
    assert "cuda_graph" not in spec.key_fields()
    keys = {cell_key("train/torch", spec.model_copy(update={"options": spec.options.model_copy(update={"cuda_graph": g})}), "digest") for g in ("auto", "on", "off")}
    assert len(keys) == 3
