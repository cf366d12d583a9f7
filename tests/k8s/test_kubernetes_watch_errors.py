"""Waiting on a group whose pod watch breaks: the API server answers the watch with HTTP 500 (as
one that is restarting does), or the connection drops in the middle of the stream (as a load
balancer's does). Neither is a fault the real API server makes on request, so the backend
reaches it through tests/k8s/api_faults.py, a proxy that answers or cuts just those requests and
forwards everything else to the plane's API server. The pods run on the real node from the
training image, acting as told (tests/k8s/scripted.py).

A watch that expires because etcd compacted its resource version (410 Gone) is made by the real
plane itself (test_kubernetes.py)."""

from __future__ import annotations

import asyncio

import pytest

from airflow_tf.backends import get_backend
from airflow_tf.cluster import GroupSpec, TrainingConfig, group_outcome

from .api_faults import ApiFaults
from .plane import wait_for
from .scripted import training_image

DONE = ["workers done 1/2", "all 2 training task(s) succeeded"]


@pytest.fixture
def proxy(kube, tmp_path):
    with ApiFaults(kube.kubeconfig, tmp_path / "proxy") as faults:
        yield faults


def launched(proxy, kube, scripted, tmp_path):
    """A 1 ps + 2 workers group launched through the proxy, its workers running; the backend."""
    backend = get_backend("kubernetes", kubernetes_conn_id=None, namespace=kube.ns, poll_interval=0.2,
                          config_file=str(proxy.write_kubeconfig(tmp_path / "through-proxy")))
    training = TrainingConfig(dataset="/data/mnist/1", run_dir="/runs/tf-mnist", steps=200)
    ref = backend.launch(GroupSpec.for_training("tf-mnist", training, ps=1, workers=2, image=training_image()))
    workers = [scripted.pod("tf-mnist-worker", i) for i in range(2)]
    for pod in workers:
        scripted.running(pod)
    return backend, ref, workers


def finish(scripted, pod: str) -> None:
    """The worker exits 0, a moment after the exec that tells it so has returned (the kubelet
    kills an exec still attached to a container that ends)."""
    scripted.act(pod, "sleep 1\nexit 0\n", wait=False)


def wait_watching(backend, ref, drive) -> list[str]:
    """The outcomes the watch yields until the group is done, while ``drive`` (blocking) runs;
    a failure of ``drive`` ends the wait."""

    async def follow() -> list[str]:
        seen = []
        async for status in backend.watch(ref, timeout=120.0):
            seen.append(group_outcome(status, ref.success_policy).reason)
            if group_outcome(status, ref.success_policy).done:
                break
        return seen

    async def run() -> list[str]:
        watching, driver = asyncio.create_task(follow()), asyncio.create_task(asyncio.to_thread(drive))
        await asyncio.wait([watching, driver], return_when=asyncio.FIRST_EXCEPTION)
        if driver.done() and driver.exception():
            watching.cancel()
        return (await asyncio.gather(watching, driver))[0]

    return asyncio.run(run())


def test_a_watch_answered_with_500_falls_back_to_listing_and_the_wait_ends(proxy, kube, scripted, tmp_path,
                                                                            caplog, capsys):
    backend, ref, workers = launched(proxy, kube, scripted, tmp_path)
    proxy.fail_next("watch", "pods", times=2)  # the API server is restarting
    start = proxy.requests()[-1].time

    def drive():
        # The first worker ends as the watches fail, the second once a watch follows the pods.
        finish(scripted, workers[0])
        wait_for(lambda: any(w.code == 200 for w in proxy.requests("watch", "pods", since=start)), 60,
                 "a watch the API server answers")
        finish(scripted, workers[1])

    seen = wait_watching(backend, ref, drive)

    assert seen[-2:] == DONE, seen
    watches = proxy.requests("watch", "pods", since=start)
    assert [w.code for w in watches[:3]] == [500, 500, 200], watches
    assert watches[-1].events, "the pods' changes came through the watch that followed"
    assert len(proxy.requests("list", "pods", since=start)) == 3, \
        "listed at the start and once after each failed watch, never polled"
    log = caplog.text + capsys.readouterr().out  # the warnings, through logging or printed by structlog
    assert log.count("watching pods failed ((500)") == 2, log


def test_a_watch_cut_mid_stream_is_followed_by_a_fresh_list_and_watch(proxy, kube, scripted, tmp_path, caplog,
                                                                       capsys):
    backend, ref, workers = launched(proxy, kube, scripted, tmp_path)
    proxy.cut_next_watch("pods", after_events=1)  # the connection drops after the first change
    start = proxy.requests()[-1].time

    def drive():
        finish(scripted, workers[0])
        wait_for(lambda: len(proxy.requests("watch", "pods", since=start)) >= 2, 60, "a second watch")
        finish(scripted, workers[1])

    seen = wait_watching(backend, ref, drive)

    assert seen[-2:] == DONE, seen
    watches = proxy.requests("watch", "pods", since=start)
    assert watches[0].fault == "cut after 1 event(s)" and watches[0].events == 1, watches[0]
    lists = proxy.requests("list", "pods", since=start)
    assert len(lists) == 2 and watches[0].time < lists[1].time < watches[1].time, \
        "listed at the start, and again between the cut watch and the next"
    log = caplog.text + capsys.readouterr().out  # the warning, through logging or printed by structlog
    assert "watching pods failed" in log and "Response payload is not completed" in log, log
