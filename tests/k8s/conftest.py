"""The Kubernetes tests' control plane: one per test session (``scripts/kube up``, or the
cluster ``AIRFLOW_TF_TEST_KUBECONFIG`` names), a namespace per test, the test as the kubelet.

Every test that uses the plane runs on one pytest-xdist worker (tests/xdist_groups.py puts them in
one group), so a run starts one plane; the node agent's tests (tests/node) start planes of their
own. When a test fails, the plane's logs (each component's, and the audit log of the service
accounts' requests) are copied next to it and the path printed.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest
from .kubelet import Kubelet
from .plane import CLUSTER_ENV, Plane


@pytest.fixture(scope="package")
def plane(tmp_path_factory):
    configured = os.environ.get(CLUSTER_ENV)
    if configured:
        yield Plane(Path(configured))
        return
    started = Plane.start(tmp_path_factory.mktemp("kube") / "plane")
    yield started
    started.stop()


@pytest.fixture(scope="package")
def kueue(plane):
    """Kueue and the JobSet controller on this session's plane (``scripts/kube kueue``, started by
    the first test that asks); on a configured cluster, skips unless both CRDs are installed."""
    if plane.private:
        plane.start_kueue()
    elif not plane.has_kueue():
        pytest.skip(f"the cluster {CLUSTER_ENV} names has no Kueue and JobSet CRDs installed")
    return plane


@pytest.fixture(scope="package")
def node(plane):
    """This session's node, its kubelet played by the tests (the private plane only)."""
    if not plane.private:
        yield None
        return
    kubelet = Kubelet(plane).start()
    yield kubelet
    kubelet.stop()


_FAILED = pytest.StashKey[list]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.stash.setdefault(_FAILED, []).append(report.when)
    return report


@pytest.fixture
def kube(request, plane, node, tmp_path):
    """A namespace of this test's own, and the backend's kubeconfig for it (``kube.kubeconfig``)."""
    prefix = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower().removeprefix("test_")).strip("-")
    namespace = plane.new_namespace(prefix or "test", tmp_path)
    yield namespace
    if request.node.stash.get(_FAILED, None):
        kept = plane.keep_logs(tmp_path / "plane-logs")
        if kept:
            print(f"the control plane's logs (namespace {namespace.ns}): {kept}")
    plane.delete_namespace(namespace.ns)
    if node is not None:
        node.release(namespace.ns)


class _KubeletOfNamespace:
    """The session's kubelet, its methods bound to one test's namespace."""

    def __init__(self, kubelet: Kubelet, namespace: str) -> None:
        self._kubelet, self.ns = kubelet, namespace

    def __getattr__(self, name: str):
        return functools.partial(getattr(self._kubelet, name), self.ns)


@pytest.fixture
def kubelet(node, kube):
    """The node's kubelet, played by this test for the pods of its namespace; skips on a real cluster."""
    if node is None:
        pytest.skip(f"plays the kubelet, which only the private plane lets a test do ({CLUSTER_ENV} is set)")
    return _KubeletOfNamespace(node, kube.ns)
