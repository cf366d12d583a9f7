"""The ``DIR/env`` file of a private Kubernetes plane (``scripts/kube up DIR --nodes N``): one
``KEY=value`` line per setting (KUBECONFIG, the nodes, the training image, the storage folder and
its volumes). ``scripts/kube`` writes it, the demo (``airflow-tf demo --kubernetes-plane``) and the tests read
it. Standard library only and a leaf, so the tooling imports it before any environment exists."""

from __future__ import annotations

import re
from pathlib import Path

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def write_plane_env(path: Path, settings: dict[str, str]) -> None:
    """Write ``settings`` to ``path``, a line each; a key that is no variable name, or a value
    with a line break, is refused (ValueError) rather than written as a file no one reads back."""
    for key, value in settings.items():
        if not _KEY.fullmatch(key):
            raise ValueError(f"{path}: {key!r} is not a variable name (letters, digits and _)")
        if "\n" in value or "\r" in value:
            raise ValueError(f"{path}: the value of {key} has a line break: {value!r}")
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))


def read_plane_env(path: Path) -> dict[str, str]:
    """The settings in ``path`` (OSError when it cannot be read); a line that is not ``KEY=value``
    is refused (ValueError naming the file and line)."""
    settings = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        key, equals, value = line.partition("=")
        if not equals or not _KEY.fullmatch(key):
            raise ValueError(f"{path}:{number}: {line!r} is not a KEY=value line; "
                             "the file is written by `scripts/kube up DIR --nodes N`")
        settings[key] = value
    return settings
