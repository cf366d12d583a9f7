"""The Kubernetes tests' cluster: one per test session (``scripts/kube up --nodes 1``: the
control plane and one real node, kubelet and containerd with the training image loaded; or the
cluster ``AIRFLOW_TF_TEST_KUBECONFIG`` names), a namespace per test. Pods really run: a test that
needs them to act out a scenario uses ``scripted`` (tests/k8s/scripted.py).

Every test that uses the plane runs on one pytest-xdist worker (tests/xdist_groups.py puts them in
one group), so a run starts one plane; the tests of tests/nodes start planes of their
own. After the private plane's ``down`` the machine is as it was before its ``up``. When a test
fails, the plane's logs (each component's, and the audit log of the service accounts' requests)
are copied next to it and the path printed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from .plane import CLUSTER_ENV, Plane, host_state, other_nodes_run
from .scripted import scripted  # noqa: F401 (a fixture)


PLANE_SETUP_TIMEOUT = 1800
"""Seconds a test of the plane may take: the first one to ask starts it, with its node's import of
the training image (5 to 12 minutes on a loaded 2-core machine), inside its own timeout."""


def pytest_collection_modifyitems(items) -> None:
    """The tests on the plane are slow ones: their pods really run, from the training image."""
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.path)).is_relative_to(here) and "plane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(PLANE_SETUP_TIMEOUT))


@pytest.fixture(scope="package")
def plane(tmp_path_factory):
    configured = os.environ.get(CLUSTER_ENV)
    if configured:
        yield Plane(Path(configured))
        return
    directory = tmp_path_factory.mktemp("kube") / "plane"
    alone = not other_nodes_run()
    before = host_state(directory)
    started = Plane.start(directory, "--nodes", "1")
    running = host_state(directory)
    assert running["aftf links"] and running["processes"] and running["cgroups"], running
    try:
        yield started
    finally:
        started.stop()
    assert not directory.exists(), "down removes the plane's directory"
    after = host_state(directory)
    tag = f"aftf{running['tag']}"
    # Other planes on this machine (other engineers', tests/nodes) come and go meanwhile: only this
    # plane's own links, cgroups, processes and mounts count; the sysctls and host paths only when
    # no other node ran at its start nor runs at its end (the first plane up records the sysctls,
    # the last one down restores them).
    assert not [link for link in after["aftf links"] if link.startswith(tag)], after["aftf links"]
    assert not [group for group in after["cgroups"] if f"{tag.removeprefix('aftf')}-" in group], after["cgroups"]
    assert not after["processes"] and not [m for m in after["mounts"] if m.startswith(str(directory))], after
    if alone and not other_nodes_run():
        assert (after["sysctls"], after["host paths"]) == (before["sysctls"], before["host paths"]), \
            "scripts/kube down left this behind"


@pytest.fixture(scope="package")
def kueue(plane):
    """Kueue and the JobSet controller on this session's plane (``scripts/kube kueue``, started by
    the first test that asks); on a configured cluster, skips unless both CRDs are installed."""
    if plane.private:
        plane.start_kueue()
    elif not plane.has_kueue():
        pytest.skip(f"the cluster {CLUSTER_ENV} names has no Kueue and JobSet CRDs installed")
    return plane


_FAILED = pytest.StashKey[list]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.stash.setdefault(_FAILED, []).append(report.when)
    return report


@pytest.fixture
def kube(request, plane, tmp_path):
    """A namespace of this test's own, and the backend's kubeconfig for it (``kube.kubeconfig``)."""
    prefix = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower().removeprefix("test_")).strip("-")
    namespace = plane.new_namespace(prefix or "test", tmp_path)
    yield namespace
    if request.node.stash.get(_FAILED, None):
        kept = plane.keep_logs(tmp_path / "plane-logs")
        if kept:
            print(f"the control plane's logs (namespace {namespace.ns}): {kept}")
    plane.delete_namespace(namespace.ns)
