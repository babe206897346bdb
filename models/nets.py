"""The old module path of karman's torch networks (now models.karman.nets), kept so that MLflow models logged before the move still load.

``mlflow.pytorch.load_model`` unpickles the surrogate: its pickle names the classes' modules as they were when it
was logged (``models.nets.surrogate``, ``models.nets.pix2pix``, ``models.nets.winograd``). Such a model carries a
copy of that code, which a fresh process imports first; a process that has already imported this package finds
the classes through the aliases below instead.
"""

import sys

from models.karman.nets import config, pix2pix, surrogate, winograd

for _module in (config, pix2pix, surrogate, winograd):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
