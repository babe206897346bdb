"""Training recipes: names, overrides, targets and upsampling.

Training recipes: the named recipes and their overrides, the delta target and the next state, the
pushforward step, and upsampling that cannot paint a checkerboard."""

import contextlib

import pytest
import torch

from models.karman.nets.config import NetConfig
from models.karman.nets.pix2pix import build_generator
from models.karman.nets.trainer import OptimConfig, Pix2Pix
from models.karman.recipe import RECIPES, get_recipe
from models.schedule import LR_FLOOR, lr_factor


def test_unknown_recipe_names_the_choices():
    with pytest.raises(ValueError, match="unknown recipe 'fancy'; choose one of default, five-minute, long-horizon, paper"):
        get_recipe("fancy")


def test_overrides_rename_the_recipe_only_when_they_change_it():
    base = get_recipe("default")
    assert base.with_overrides(noise=None, unroll=base.unroll) is base
    changed = base.with_overrides(noise=0.0, unroll=1)
    assert (changed.noise, changed.unroll, changed.name) == (0.0, 1, "default+noise=0.0,unroll=1")
    with pytest.raises(ValueError, match="unroll 0 must be at least 1"):
        base.with_overrides(unroll=0)
    with pytest.raises(ValueError, match="neither an adversarial nor an L1 term"):
        base.with_overrides(l1_weight=0.0)
    with pytest.raises(ValueError, match="damping 0.5 filters the predicted change: it needs predict delta, not state"):
        base.with_overrides(predict="state", damping=0.5)


def test_a_constrained_recipe_trains_on_whole_frames_only():
    from pydantic import ValidationError

    from tasks.common.specs import TrainSpec

    spec = TrainSpec(constrain=True)
    assert spec.options.resolved_recipe().constrain and spec.options.resolved_recipe().name == "default+constrain=True"
    assert not TrainSpec().options.resolved_recipe().constrain
    with pytest.raises(ValidationError, match="constrain holds the inlet column: it trains on whole frames, not crops of 32"):
        TrainSpec(constrain=True, crop=32)


def test_the_paper_recipe_is_the_studys_pix2pix():
    paper = RECIPES["paper"]
    assert (paper.predict, paper.upsample, paper.output, paper.dropout) == ("state", "transpose", "tanh", 0.5)
    assert (paper.gan_weight, paper.l1_weight, paper.lr, paper.beta1, paper.ngf) == (1.0, 100.0, 2e-4, 0.5, 64)


def test_the_cosine_schedule_falls_from_the_rate_to_its_floor_along_half_a_cosine():
    assert lr_factor("cosine", 0.0) == pytest.approx(1.0)
    assert lr_factor("cosine", 0.5) == pytest.approx((1 + LR_FLOOR) / 2)
    assert lr_factor("cosine", 1.0) == pytest.approx(LR_FLOOR)
    assert lr_factor("cosine", 0.25) == pytest.approx(LR_FLOOR + (1 - LR_FLOOR) * (2 + 2**0.5) / 4)
    assert lr_factor("cosine", -1.0) == lr_factor("cosine", 0.0) and lr_factor("cosine", 7.0) == lr_factor("cosine", 1.0)
    values = [lr_factor("cosine", p / 10) for p in range(11)]
    assert all(a > b for a, b in zip(values, values[1:]))
    assert {lr_factor("constant", p) for p in (0.0, 0.3, 1.0, 2.0)} == {1.0}
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'step'; choose constant or cosine"):
        lr_factor("step", 0.5)
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'step'"):
        get_recipe("default").with_overrides(schedule="step")


def test_a_schedule_sets_both_optimisers_rates_from_the_recipes():
    model = _model("default", gan_weight=1.0)
    model.set_lr_factor(0.25)
    rates = {g["lr"] for opt in (model.opt_g, model.opt_d) for g in opt.param_groups}
    assert rates == {0.25 * get_recipe("default").lr}


def _model(recipe: str, **overrides) -> Pix2Pix:
    r = get_recipe(recipe).with_overrides(**overrides)
    net = NetConfig(in_channels=4, out_channels=3, size=16, ngf=4, ndf=4, dropout=r.dropout, upsample=r.upsample, output=r.output)
    torch.manual_seed(0)
    return Pix2Pix(net, OptimConfig.from_recipe(r, delta_ratio=[0.05, 0.1, 0.02]))


def test_the_delta_target_decodes_back_to_the_target_state():
    model = _model("default")
    cond, target = torch.randn(2, 4, 16, 16), torch.randn(2, 3, 16, 16)
    encoded = model.encode_target(cond, target)
    torch.testing.assert_close(model.next_state(cond, encoded), target, rtol=0, atol=1e-6)
    # the change is in units of its RMS: a change of one RMS in u is 0.05 state units
    assert model.next_state(cond, torch.ones(2, 3, 16, 16))[:, 0].sub(cond[:, 0]).allclose(torch.full((2, 16, 16), 0.05))
    state_model = _model("paper")
    assert state_model.next_state(cond, target) is target


def test_a_pushforward_step_scores_both_steps_and_leaves_the_discriminator_alone():
    model = _model("default", unroll=2)
    d_before = [p.detach().clone() for p in model.discriminator.parameters()]
    g_before = [p.detach().clone() for p in model.generator.parameters()]
    cond, target = torch.randn(4, 4, 16, 16), torch.randn(4, 6, 16, 16)  # two future states
    losses = model.train_step(cond, target, contextlib.nullcontext)
    assert set(losses) == {"loss_d", "loss_g_gan", "loss_l1", "loss_l1_step2"}
    assert all(torch.isfinite(v) for v in losses.values()) and losses["loss_d"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(g_before, model.generator.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(d_before, model.discriminator.parameters()))
    with pytest.raises(ValueError, match="target has 6 channels; unroll 3 needs 9"):
        _model("default", unroll=3).train_step(cond, target, contextlib.nullcontext)


def test_a_curriculum_grows_the_loss_from_one_step_to_the_unroll_in_equal_parts():
    r = get_recipe("default").with_overrides(unroll=3, curriculum=0.6)
    assert [r.loss_steps(p) for p in (0.0, 0.19, 0.2, 0.39, 0.4, 0.6, 1.0, 1.5)] == [1, 1, 2, 2, 3, 3, 3, 3]
    assert {get_recipe("default").loss_steps(p) for p in (0.0, 0.5, 1.0)} == {3}  # no curriculum: the full unroll throughout
    assert r.with_overrides(unroll=1).loss_steps(0.0) == 1
    with pytest.raises(ValueError, match="curriculum 1.5 is a fraction of the run: choose 0"):
        r.with_overrides(curriculum=1.5)
    with pytest.raises(ValueError, match="unknown pushforward 'sideways'; choose detached or through"):
        r.with_overrides(pushforward="sideways")
    with pytest.raises(ValueError, match="4 loss steps: choose 1 to the unroll, 3"):
        _model("default").train_step(torch.randn(2, 4, 16, 16), torch.randn(2, 9, 16, 16), contextlib.nullcontext, steps=4)


def _gradients_of_one_step(pushforward: str, steps: int | None = None, unroll: int = 3) -> list[torch.Tensor]:
    """The generator's gradients after one step on a fixed batch (noise off: the same input every time)."""
    model = _model("default", unroll=unroll, noise=0.0, pushforward=pushforward)
    torch.manual_seed(1)
    cond, target = torch.randn(2, 4, 16, 16), torch.randn(2, 9, 16, 16)  # the same first states whatever the unroll
    model.opt_g.step = lambda: None  # keep the weights: the gradients are what is compared
    model.train_step(cond, target[:, : 3 * unroll], contextlib.nullcontext, steps=steps)
    return [p.grad.clone() for p in model.generator.parameters()]


def test_gradients_through_the_chain_are_those_of_the_whole_unrolled_loss():
    """Through: the gradient of the three steps' summed L1 with the chain differentiated end to end (autograd on the
    plain composition); detached: each step's input taken as a constant, which differs; one loss step: no chain."""
    model = _model("default", unroll=3, noise=0.0)
    torch.manual_seed(1)
    cond, target = torch.randn(2, 4, 16, 16), torch.randn(2, 9, 16, 16)
    state, loss = cond, 0.0
    for t in target.chunk(3, dim=1):
        out = model.generator(state)
        loss = loss + (out - model.encode_target(state, t)).abs().mean()
        state = torch.cat([model.next_state(state, out), cond[:, 3:]], dim=1)
    expected = torch.autograd.grad(loss, list(model.generator.parameters()))
    through, detached = _gradients_of_one_step("through"), _gradients_of_one_step("detached")
    for got, want in zip(through, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert max(float((a - b).abs().max()) for a, b in zip(through, detached)) > 1e-3
    for a, b, c in zip(_gradients_of_one_step("through", steps=1), _gradients_of_one_step("detached", steps=1),
                       _gradients_of_one_step("detached", unroll=1)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-7)


def _checkerboard(upsample: str) -> float:
    """Spread of the generator's output on a constant input, away from the borders."""
    torch.manual_seed(0)
    net = build_generator(NetConfig(in_channels=4, out_channels=3, size=64, depth=2, ngf=4, upsample=upsample, output="linear")).eval()
    with torch.no_grad():
        out = net(torch.full((1, 4, 64, 64), 0.3))
    return float(out[0, 0, 16:48, 16:48].std())  # one channel: the channels differ in level


def test_resize_upsampling_keeps_a_constant_input_constant_where_transposed_convolutions_paint_a_checkerboard():
    assert _checkerboard("resize") < 1e-6
    assert _checkerboard("transpose") > 1e-4


def test_the_broadcast_doubling_for_xla_equals_torchs_nearest_upsampling_and_its_gradient():
    from models.karman.nets.pix2pix import NearestDouble, broadcast_double

    x = torch.randn(2, 3, 5, 7, requires_grad=True)
    grad_out = torch.randn(2, 3, 10, 14)
    ours, theirs = broadcast_double(x), torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(NearestDouble()(x), theirs, rtol=0, atol=0)  # on cpu: torch's own kernel
    # the backward sums each pixel's four copies, in another order: within a rounding of the float32 sum
    torch.testing.assert_close(torch.autograd.grad(ours, x, grad_out)[0], torch.autograd.grad(theirs, x, grad_out)[0], rtol=1e-6, atol=1e-6)


def test_a_resize_generator_gives_the_same_output_and_gradients_with_the_broadcast_doubling_xla_runs(monkeypatch):
    from models.karman.nets import pix2pix

    torch.manual_seed(0)
    net = build_generator(NetConfig(in_channels=4, out_channels=3, size=32, depth=3, ngf=4, upsample="resize", output="linear"))
    x = torch.randn(2, 4, 32, 64)

    def run():
        torch.manual_seed(1)  # the same dropout masks
        net.zero_grad()
        out = net(x)
        out.square().mean().backward()
        return out.detach(), [p.grad.clone() for p in net.parameters()]

    kernel = run()
    monkeypatch.setattr(pix2pix.NearestDouble, "forward", lambda self, t: pix2pix.broadcast_double(t))
    broadcast = run()
    torch.testing.assert_close(broadcast[0], kernel[0], rtol=0, atol=0)
    for ours, theirs in zip(broadcast[1], kernel[1]):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_the_measured_recipes_are_asked_for_by_name_and_hold_the_flags_docs_measured():
    from tasks.common.specs import TrainSpec

    long = TrainSpec(recipe="long-horizon")
    recipe = long.options.resolved_recipe()
    assert (recipe.name, recipe.condition, recipe.curriculum, recipe.damping, recipe.noise, long.options.stride) == ("long-horizon", "reynolds", 0.5, 1.0, 0.02, 2)
    five = TrainSpec(recipe="five-minute").options.resolved_recipe()
    assert (five.name, five.unroll, five.curriculum, five.frame_stride) == ("five-minute", 2, 1.0, 1)
    # the five flags give the same recipe as the name, apart from its name; a flag beside the name renames it
    flags = TrainSpec(condition="reynolds", frame_stride=2, curriculum=0.5, damping=1.0, noise=0.02).options.resolved_recipe()
    assert {**vars(flags), "name": "long-horizon"} == vars(recipe)
    assert TrainSpec(recipe="long-horizon", frame_stride=1).options.resolved_recipe().name == "long-horizon+frame_stride=1"
    assert TrainSpec().options.stride == 1 and TrainSpec().options.frame_stride is None
