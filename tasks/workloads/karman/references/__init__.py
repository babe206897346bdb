"""The Kármán surrogate's training step as each framework's documentation teaches it: the pix2pix repository's nested U-Net blocks and optimize_parameters in PyTorch, the TensorFlow pix2pix tutorial's GradientTape step under tf.function, and a jitted JAX step with optax.

The step is the bench's recipe (``train``'s default, which bench-frameworks trains): the U-Net predicts the change
of state in units of its RMS over the training pairs; its loss is the L1 of that change over three steps, the
later two predicted from the network's own detached predictions (pushforward), the input state noised; Adam with
a cosine decay of the rate over the block. That recipe trains no discriminator (its GAN weight is 0), so the
references have none; they refuse a recipe they do not write (``recipe_of``).

The networks are built from our initial weights, passed as numpy arrays under our torch generator's state dict
names and layouts (convolutions (O, I, kh, kw)), with the recipe's ``delta_ratio`` (network units of the change
-> of the state, per channel: a number the data fixes). The weights' names in the pix2pix repository's nesting
order are ``unet_order``'s.
"""

import numpy as np

from tasks.common.config.errors import UserError


def arrays(data) -> tuple[np.ndarray, np.ndarray]:
    """Every training pair in network units, in memory: cond (N, 4, H, W) and target (N, 3·unroll, H, W)."""
    return data.train.batch(np.arange(len(data.train)), data.codec.norm)


def recipe_of(spec):
    """The spec's recipe, where the references write it: UserError naming what they do not (a discriminator, a
    pushforward through the chain, damping, constraints, crops, dropout, transposed convolutions, instance norm)."""
    recipe = spec.options.resolved_recipe()
    unsupported = [what for what, on in (("a GAN term", recipe.gan_weight > 0), ("pushforward through", recipe.pushforward == "through"),
                                         ("damping", recipe.damping > 0), ("constraints", recipe.constrain), ("crops", bool(spec.options.crop)),
                                         ("dropout", recipe.dropout > 0), ("transposed convolutions", recipe.upsample != "resize"),
                                         ("instance norm", spec.options.norm != "batch")) if on]
    if unsupported:
        raise UserError(f"the karman references write the default recipe's step; recipe {recipe.name!r} has {', '.join(unsupported)}")
    return recipe


def depth_of(weights: dict[str, np.ndarray]) -> int:
    """The U-Net's down-blocks, counted from the weights' names."""
    return 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("down."))


def unet_order(depth: int) -> list[tuple[str, str]]:
    """(our state dict prefix, "conv" or "norm") of the U-Net's layers in the order the pix2pix repository's nested
    blocks hold them: the encoder outside in, then the decoder inside out."""
    down = [("down.0", "conv")] + [item for i in range(1, depth) for item in [(f"down.{i}.1", "conv")] + ([(f"down.{i}.2", "norm")] if i < depth - 1 else [])]
    up = [item for i in range(depth - 1, -1, -1) for item in [(f"up.{i}.1.1", "conv")] + ([(f"up.{i}.2", "norm")] if i > 0 else [])]
    return down + up


def widths_of(weights: dict[str, np.ndarray], depth: int) -> list[int]:
    """Each down-block's output channels."""
    return [weights["down.0.weight" if i == 0 else f"down.{i}.1.weight"].shape[0] for i in range(depth)]
