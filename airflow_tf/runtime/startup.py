"""Loading TensorFlow in a process of ours (a task, an evaluation, an export) without what it
never uses: Keras imports several packages at start-up only if they are installed, for
utilities no task calls, at 2-3 s of CPU for every process that starts (a restarted group
starts all of its tasks again). Hidden while TensorFlow loads, they import as usual afterwards,
so a user's model code may still use them; Keras' own scikit-learn wrappers and image plotting
stay off in such a process (an evaluation on the local backend runs in the Airflow task's).

A task that only serves (a ps, a coordinator's worker) needs less still: TensorFlow's runtime
and its gRPC server, not the ``tf.*`` Python API that ``import tensorflow`` builds
(:func:`import_tensorflow_server`).

Either loads with Python's cyclic garbage collector paused (:func:`collector_paused`)."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import sys
import types
from collections.abc import Iterator

KERAS_OPTIONAL_PACKAGES = ("sklearn", "matplotlib", "pandas")
"""Keras' scikit-learn wrappers, its image plotting, and DataFrames given to ``fit``."""


@contextlib.contextmanager
def _hidden(packages: tuple[str, ...]) -> Iterator[None]:
    """``import <package>`` fails inside the block for each package not loaded yet."""
    hidden = [name for name in packages if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # the import system's "not importable"
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside the block, as it was after. Loading TensorFlow makes
    a few hundred thousand objects that all stay; each threshold they cross sets off a collection,
    and the oldest generation's walks everything loaded so far: an eighth of a fork server's start
    (``bench/bench_tf_load.py``), for garbage that is not there."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def import_tensorflow(keras: bool = True):
    """The ``tensorflow`` module, loaded lean if this is its first import in the process. Without
    ``keras``, no Keras at all: for a process that only runs graphs built elsewhere (a ps, a
    coordinator's worker, a check that loads an export as TensorFlow Serving does, with no Keras)."""
    with collector_paused(), _hidden(KERAS_OPTIONAL_PACKAGES + (() if keras else ("keras",))):
        import tensorflow as tf

        if isinstance(tf, _DeferredPackage):  # a lean server start before: the API loads now, lean too
            tf._run_init()
    return tf


class _DeferredPackage(types.ModuleType):
    """The ``tensorflow`` package with its ``__init__`` (the ``tf.*`` API) not run yet: its
    submodules import as usual, and the first use of any other attribute runs the ``__init__``,
    so code that does ``import tensorflow as tf`` later in the process still gets all of it."""

    def __getattr__(self, name: str):
        self._run_init()
        return getattr(self, name)

    def _run_init(self) -> None:
        spec = self.__spec__
        assert spec is not None and spec.loader is not None
        # Once: an attribute the __init__ does not define is then an AttributeError.
        self.__class__ = types.ModuleType  # type: ignore[assignment]
        with collector_paused():
            exec(spec.loader.get_code(spec.name), self.__dict__)  # type: ignore[attr-defined]


def _has_plugins() -> bool:
    """TensorFlow's ``__init__`` also loads pluggable devices (a vendor's plugin) from these
    folders; only the whole import does that."""
    return any(os.path.isdir(os.path.join(path, "tensorflow-plugins")) for path in sys.path if path)


def import_tensorflow_server():
    """TensorFlow's ``server_lib`` (``Server``, ``ClusterSpec``): its C++ runtime, every kernel
    and the gRPC server, without the ``tf.*`` Python API, about a fifth of the CPU of ``import
    tensorflow``. For a process that only serves graphs built elsewhere (a ps, a coordinator's
    worker); if that process later imports ``tensorflow``, the rest loads then."""
    with collector_paused():
        return _import_server_lib()


def _import_server_lib():
    if "tensorflow" not in sys.modules:
        spec = importlib.util.find_spec("tensorflow")
        if spec is None or spec.submodule_search_locations is None or _has_plugins():
            import_tensorflow(keras=False)
        else:
            package = _DeferredPackage(spec.name)
            package.__spec__, package.__loader__, package.__file__ = spec, spec.loader, spec.origin
            package.__path__, package.__package__ = list(spec.submodule_search_locations), spec.name
            sys.modules[spec.name] = package
            # Kernels shipped as libraries of their own, which the __init__ would load
            # (TensorFlow 2.19: the Sobol sampler's).
            kernels = os.path.join(os.path.dirname(spec.origin or ""), "core", "kernels")
            if os.path.isdir(kernels):
                from tensorflow.python.framework import load_library

                load_library.load_library(kernels)
    from tensorflow.python.training import server_lib

    return server_lib
