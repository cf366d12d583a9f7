"""Loading TensorFlow in a process of ours (a task, an evaluation, an export) without what it
never uses: Keras imports several packages at start-up only if they are installed, for
utilities no task calls, at 2-3 s of CPU for every process that starts (a restarted group
starts all of its tasks again). Hidden while TensorFlow loads, they import as usual afterwards,
so a user's model code may still use them; Keras' own scikit-learn wrappers and image plotting
stay off in such a process (an evaluation on the local backend runs in the Airflow task's)."""

from __future__ import annotations

import contextlib
import sys
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


def import_tensorflow(keras: bool = True):
    """The ``tensorflow`` module, loaded lean if this is its first import in the process. Without
    ``keras``, no Keras at all: for a process that only runs graphs built elsewhere (a ps, a
    coordinator's worker, a check that loads an export as TensorFlow Serving does, with no Keras)."""
    with _hidden(KERAS_OPTIONAL_PACKAGES + (() if keras else ("keras",))):
        import tensorflow as tf
    return tf
