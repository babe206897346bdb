"""Python's cycle collector in processes that import large libraries: off while they load, then never walking them again.

A job or command process imports hundreds of thousands of objects (TensorFlow, torch, JAX, MLflow, Prefect) that live
as long as the process. While they load, the collector runs a collection every 700 new container objects and now and
then walks the whole heap; over TensorFlow, MLflow and Prefect that is about 15 % of the import's CPU (1.2 s of 7.4–9.2 s
on a 2-core host; docs/architecture.md has the command). ``uncollected`` runs such an import with the collector off and
then moves what it left to the collector's permanent generation (``gc.freeze``): later collections skip those objects,
and a process forked from one that froze them (a warm server's job) does not copy their memory pages by counting them.
Cycles made after it are collected as usual. A process that goes on making and dropping objects of its own after the
import (a command's flow, a test worker calling commands in-process) takes ``paused`` instead: the collector off while the
libraries load and back on after, nothing frozen (a frozen object that later becomes garbage in a cycle is never freed).
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """The body with the cycle collector off, then the collector as it was before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def uncollected() -> Iterator[None]:
    """The body with the cycle collector off; what is alive at its end frozen, and the collector as it was before."""
    with paused():
        try:
            yield
        finally:
            gc.freeze()


def settle() -> None:
    """Freeze every object alive now (gc.freeze) and turn the collector on: a process forked from one that had it off."""
    gc.freeze()
    gc.enable()
