"""TensorFlow and Keras imported without the two packages they load only because they are installed.

TensorFlow's Lite converter imports JAX for one optional function, and Keras imports scikit-learn for its scikit-learn
wrappers; both catch the ImportError of a missing package. This environment has both installed (JAX is a framework of
its own here, scikit-learn comes with the digits' package), and no TensorFlow job uses either: marked missing while
TensorFlow loads, they cost nothing (about 2.5 s of CPU an import on the 2-core AVX2 host; the figures and the commands
that measured them are in docs/architecture.md). Afterwards both import as usual, in the same process, for whoever asks.
"""

import sys

UNUSED = ("jax", "sklearn")  # imported by TensorFlow's and Keras' own modules inside try/except ImportError


def import_tensorflow() -> None:
    """``import tensorflow, keras`` with UNUSED marked missing while they load (a no-op once TensorFlow is loaded)."""
    if "tensorflow" in sys.modules:
        return
    hidden = [name for name in UNUSED if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # `import name` raises ImportError
    try:
        import tensorflow  # noqa: F401

        import keras  # noqa: F401
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
