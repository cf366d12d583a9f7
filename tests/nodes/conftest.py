"""The plane of tests/nodes that a test asks for by the ``nodes_plane`` fixture: three real nodes
with Kueue and JobSet, started once for the package and downed at its end, when ``scripts/kube down``
must have left nothing of it on this machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .host import NOTHING, down, leftovers, real_nodes, shared_storage, up_with_nodes

NODES = 3


@pytest.fixture(scope="package")
def nodes_plane(tmp_path_factory) -> Iterator[tuple[Path, Path]]:
    """The plane's directory and the storage folder its pods share with Airflow."""
    directory = tmp_path_factory.mktemp("nodes") / "plane"
    with shared_storage() as storage:
        up_with_nodes(directory, storage, kueue=True, nodes=NODES)
        nodes = real_nodes(directory)
        try:
            yield directory, storage
        finally:
            down(directory)
    assert leftovers(directory, nodes) == NOTHING, "scripts/kube down left this behind"
