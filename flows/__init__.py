"""Composition, parameters and the command line (``python -m flows``)."""
