"""Neural surrogates (torch): the Pix2Pix generator and discriminator, chosen by name."""

from models.nets.pix2pix import NetConfig, PatchDiscriminator, UNetGenerator, build_discriminator, build_generator, use_gemm_for_small_maps, use_winograd

__all__ = ["NetConfig", "PatchDiscriminator", "UNetGenerator", "build_discriminator", "build_generator", "use_gemm_for_small_maps", "use_winograd"]
