"""The one Kubernetes test left on the API emulator (kube_emulator.py): a watch that the API
server answers with HTTP 500, as one that is restarting does.

The real plane (test_kubernetes.py) cannot be made to fail a chosen request: stopping its API
server would stop every other request too, and the tests have no other way in. Everything else
the backend does, watches included (their expiry by etcd compaction among them), is tested there."""

from __future__ import annotations

import asyncio
import time

import pytest
from .kube_emulator import KubeEmulator

from airflow_tf.backends import get_backend
from airflow_tf.cluster import GroupSpec, TrainingConfig, group_outcome

NS = "ml"


@pytest.fixture
def emulator():
    emu = KubeEmulator().start()
    yield emu
    emu.stop()


def test_watch_falls_back_to_listing_when_the_watch_fails(emulator, tmp_path):
    kubeconfig = str(emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          poll_interval=0.2)
    training = TrainingConfig(dataset="/data/mnist/1", run_dir="/runs/tf-mnist", steps=200)
    ref = backend.launch(GroupSpec.for_training("tf-mnist", training, ps=1, workers=2, image="registry.example/tf:2.21"))
    start = emulator.calls()[-1].time
    emulator.fail_next("watch", 2)  # the API server is restarting

    async def run():
        async def drive():
            await asyncio.sleep(0.05)
            emulator.succeed(NS, emulator.pod(NS, "tf-mnist-worker", 0))
            # The second success comes once the watch follows the pods again (on a loaded
            # machine the two retries can take longer than any fixed pause).
            deadline = time.monotonic() + 5.0
            while len(emulator.calls("watch", "pods", since=start)) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            emulator.succeed(NS, emulator.pod(NS, "tf-mnist-worker", 1))

        driver = asyncio.create_task(drive())
        seen = []
        async for status in backend.watch(ref, timeout=10.0):
            seen.append(status)
            if group_outcome(status, ref.success_policy).done:
                break
        await driver
        return seen

    seen = asyncio.run(run())
    assert [group_outcome(s).reason for s in seen][-2:] == ["workers done 1/2", "all 2 training task(s) succeeded"]
    assert len(emulator.calls("watch", "pods", since=start)) == 3, "after two failed watches, the third follows the pods"
    assert len(emulator.calls("list", "pods", since=start)) == 3, \
        "listed at the start and once after each failed watch, never polled"
