"""The operators with backend="kubernetes", on the real control plane (test_kubernetes.py): the teardown
of a launch that died before returning, on_finish_action, and evaluation and export run as
Jobs on the training image so that Airflow needs no TensorFlow.

The operators' ``execute`` is called directly, in a DAG, with the few context entries they
read (a task instance's ids and XCom counts, the outlet events) standing in for Airflow's
task runner: what is under test is what they do on the cluster, as a service account bound only
to the shipped Role."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from types import SimpleNamespace

import pytest
from .plane import REMOVAL_BOUND, wait_for
from .scripted import original_command, training_image
from .test_kubernetes import kubeconfig, make_spec, pod, tasks_of  # noqa: F401 (fixtures)

from airflow_tf.backends import BackendError, get_backend
from airflow_tf.backends.kubernetes.labels import GROUP_LABEL
from airflow_tf.cluster import group_name
from airflow_tf.operators.common import launch_labels
from airflow_tf.cluster.components import RESULT_MARKER
from airflow_tf.serving.__main__ import main as serving_main


class _TaskInstance(SimpleNamespace):
    """The task instance fields the teardown reads."""

    def get_ti_count(self, **query):
        return 1


def _options(kube):
    return {"kubernetes_conn_id": None, "config_file": str(kube.kubeconfig), "namespace": kube.ns, "poll_interval": 0.05}


def _dag_with_launch(kube, **teardown_args):
    from airflow.sdk import DAG

    from airflow_tf.operators import LaunchTFClusterOperator, TeardownTFClusterOperator

    with DAG("train_k8s", schedule=None) as dag:
        launch = LaunchTFClusterOperator(task_id="launch", dataset="/data/mnist/1", backend="kubernetes",
                                         backend_options=_options(kube), image=training_image())
        teardown = TeardownTFClusterOperator(task_id="teardown", launch=launch, **teardown_args)
    return dag, teardown


def test_teardown_of_a_launch_that_died_before_returning_removes_its_group(kube, scripted):
    dag, teardown = _dag_with_launch(kube)
    assert teardown.backend == "kubernetes", "the launch's backend, never a fallback to the local one"
    run_id = "manual__2026-11-22T00:00:00+00:00"
    # The launch created the group (with its labels), then its process was killed: no XCom was ever pushed.
    name = group_name("train_k8s", "launch", run_id, -1)
    labels = launch_labels("train_k8s", "launch", run_id, -1)
    get_backend("kubernetes", **_options(kube)).launch(make_spec(name=name, labels=labels))
    wait_for(lambda: len(tasks_of(kube, f"{GROUP_LABEL}={name}")) == 3, 30, "the group's three pods")

    deleted = teardown.execute({"ti": _TaskInstance(dag_id="train_k8s", run_id=run_id)})
    assert deleted[0] == f"job/{name}-worker"
    for kind in ("jobs", "pods", "services"):
        wait_for(lambda: kube.gone(kind, f"{GROUP_LABEL}={name}"), REMOVAL_BOUND, f"the group's {kind} to be gone")


def test_teardown_leaves_alone_a_same_named_group_its_launch_did_not_start(kube, scripted):
    dag, teardown = _dag_with_launch(kube)
    run_id = "manual__2026-11-22T00:00:00+00:00"
    name = group_name("train_k8s", "launch", run_id, -1)
    # Someone else's group under the name this launch would have used (another run's labels).
    other = launch_labels("train_k8s", "launch", "manual__another", -1)
    get_backend("kubernetes", **_options(kube)).launch(make_spec(name=name, labels=other))

    assert teardown.execute({"ti": _TaskInstance(dag_id="train_k8s", run_id=run_id)}) == []
    time.sleep(1.5)  # time enough for a deletion to show
    assert len(tasks_of(kube, f"{GROUP_LABEL}={name}")) == 3, "not ours: not deleted"


@pytest.mark.parametrize("action, succeeded, kept", [
    ("delete_pod", False, []),
    ("delete_succeeded_pod", False, [("worker", 0), ("worker", 1)]),
    ("delete_succeeded_pod", True, []),
    ("keep_pod", True, [("worker", 0), ("worker", 1)]),
])
def test_on_finish_action_keeps_the_trainers_as_asked_and_always_stops_the_ps(kube, scripted, action,
                                                                              succeeded, kept):
    from airflow_tf.operators import TeardownTFClusterOperator

    ref = get_backend("kubernetes", **_options(kube)).launch(make_spec())
    worker0, worker1 = pod(scripted, "worker", 0), pod(scripted, "worker", 1)
    pod(scripted, "ps", 0)
    scripted.succeed(worker0, log="worker 0 says goodbye\n")
    if succeeded:
        scripted.succeed(worker1)
    else:
        scripted.fail(worker1, exit_code=2)
    wait_for(lambda: (kube.get("jobs", "tf-mnist-worker").get("status") or {}).get("conditions"), 30,
             "the worker Job to finish")
    teardown = TeardownTFClusterOperator(task_id=f"teardown_{action}", group=ref.to_dict(), backend="kubernetes",
                                         on_finish_action=action)
    messages = []
    teardown.log.info = lambda message, *args: messages.append(message % args)  # what the task log shows
    teardown.execute({"ti": _TaskInstance(dag_id="d", run_id="r")})
    wait_for(lambda: tasks_of(kube) == kept, 30, f"the pods left to be {kept}")
    assert any("worker 0 says goodbye" in m for m in messages), "logs are copied before anything is deleted"


def test_on_finish_action_must_be_one_the_provider_knows():
    from airflow_tf.operators import TeardownTFClusterOperator

    with pytest.raises(ValueError, match="on_finish_action: 'keep_failed' is not one of delete_pod, "
                                         "delete_succeeded_pod, keep_pod"):
        TeardownTFClusterOperator(task_id="t", group={"backend": "local", "name": "g"}, on_finish_action="keep_failed")


def _component_pod(kube, scripted, component, log, outcome="succeed", message=None, created=None):
    """The one-off Job's pod prints ``log``, writes ``message`` to its termination-log file and
    exits (0, or the exit code ``outcome``). ``created`` gets the Job as created (it is deleted
    once finished)."""

    def run():
        selector = f"airflow-tf/component={component}"
        name = wait_for(lambda: next((p["metadata"]["name"] for p in kube.objects("pods", selector)
                                      if p["spec"].get("nodeName")), None), 30, f"the {component} pod")
        if created is not None:
            created.append(kube.get("jobs", f"tf-mnist-{component}"))
        scripted.exit(name, 0 if outcome == "succeed" else outcome, log=log, message=message, wait=False)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _launch_result(ref):
    return {"group": ref.to_dict(), "run_dir": "/runs/tf-mnist", "dataset": "/data/mnist/1",
            "training": {"dataset": "/data/mnist/1", "run_dir": "/runs/tf-mnist", "steps": 200}, "reattached": False}


def test_evaluation_and_export_run_as_jobs_and_their_results_come_back(kube, scripted):
    from airflow_tf.operators import EvaluateModelOperator, ExportSavedModelOperator

    ref = get_backend("kubernetes", **_options(kube)).launch(make_spec())
    get_backend("kubernetes", **_options(kube)).teardown(ref)  # evaluation runs after the teardown
    metrics = {"run_dir": "/runs/tf-mnist", "checkpoint": "/runs/tf-mnist/model.ckpt-200",
               "metrics": {"mse": 0.01}, "blessed": True, "global_step": 200}
    # The log's result line is for people: the result is what the container wrote to its termination message.
    created = []
    thread = _component_pod(kube, scripted, "evaluate", "evaluating\n" + RESULT_MARKER + '{"blessed": false}\n',
                      message=json.dumps(metrics), created=created)
    result = EvaluateModelOperator(task_id="evaluate", launch=_launch_result(ref),
                                   thresholds={"mse": {"max": 1.0}}).execute({})
    thread.join()
    assert result["blessed"] is True and result["metrics"] == {"mse": 0.01}
    assert created[0]["spec"]["template"]["spec"]["containers"][0]["image"] == training_image()
    command = original_command(created[0])
    assert command[:5] == ["python", "-m", "airflow_tf.serving", "evaluate", "--request"]
    assert json.loads(command[5])["thresholds"] == {"mse": {"max": 1.0}}

    exported = {"path": "/models/mnist/3", "version": 3, "model_name": "mnist", "metrics": metrics["metrics"],
                "blessed": True}
    thread = _component_pod(kube, scripted, "export", "exporting\n", message=json.dumps(exported), created=created)
    # Keyed by the asset's name, as Airflow's own accessor is (an Asset is unhashable on Airflow 3.1).
    events = defaultdict(SimpleNamespace)

    class OutletEvents:
        def __getitem__(self, asset):
            return events[asset.name]

    context = {"outlet_events": OutletEvents()}
    result = ExportSavedModelOperator(task_id="export", launch=_launch_result(ref), model_name="mnist",
                                      metrics=result, serving_base="/models").execute(context)
    thread.join()
    assert (result["version"], result["path"]) == (3, "/models/mnist/3")
    assert events["airflow_tf.model.mnist"].extra["version"] == 3, "the model asset's event names the version"
    request = json.loads(original_command(created[1])[5])
    assert request["serving_base"] == "/models" and request["metrics"]["blessed"] is True
    wait_for(lambda: kube.gone("jobs"), 30, "finished one-off Jobs to be deleted")


def test_a_refused_evaluation_fails_without_retries_naming_the_pod(kube, scripted):
    from airflow.providers.common.compat.sdk import AirflowFailException

    from airflow_tf.operators import EvaluateModelOperator

    ref = get_backend("kubernetes", **_options(kube)).launch(make_spec())
    thread = _component_pod(kube, scripted, "evaluate", "evaluate refused: no checkpoint in /runs/tf-mnist\n", outcome=2)
    with pytest.raises(AirflowFailException, match=r"(?s)evaluation refused: evaluate Job tf-mnist-evaluate failed "
                                                   r"\(pod tf-mnist-evaluate-\w+: exit code 2, phase Failed\).*no checkpoint"):
        EvaluateModelOperator(task_id="evaluate", launch=_launch_result(ref)).execute({})
    thread.join()


LARGE_RESULT = {"run_dir": "/runs/tf-mnist", "checkpoint": "/runs/tf-mnist/model.ckpt-200", "blessed": True,
                "metrics": {f"metric_{i}": 0.5 for i in range(400)}}


def test_a_result_too_large_for_the_termination_message_is_read_from_the_log(kube, scripted):
    from airflow_tf.operators import EvaluateModelOperator

    ref = get_backend("kubernetes", **_options(kube)).launch(make_spec())
    text = json.dumps(LARGE_RESULT, sort_keys=True)
    assert len(text) > 4096
    thread = _component_pod(kube, scripted, "evaluate", f"evaluating\n{RESULT_MARKER}{text}\n", message=text)
    result = EvaluateModelOperator(task_id="evaluate", launch=_launch_result(ref)).execute({})
    thread.join()
    assert result["metrics"] == LARGE_RESULT["metrics"], "the whole result, not the kubelet's cut-short end"


@pytest.mark.parametrize("message, complaint", [
    (None, r"succeeded without writing its result to its termination message \(/dev/termination-log\)"),
    ("Traceback (most recent call last):", r"its termination message is not JSON"),
    ('["a list"]', r"its termination message is not a JSON object"),
    (json.dumps(LARGE_RESULT), r"its result is larger than a termination message holds \(4096 bytes.*which is not "
                               r"JSON either"),
])
def test_a_missing_or_bad_result_fails_the_evaluation_naming_the_pod(kube, scripted, message, complaint):
    from airflow_tf.operators import EvaluateModelOperator

    ref = get_backend("kubernetes", **_options(kube)).launch(make_spec())
    thread = _component_pod(kube, scripted, "evaluate", "evaluating\n", message=message)
    with pytest.raises(BackendError, match=rf"evaluate pod tf-mnist-evaluate-\w+ \(namespace {kube.ns}\).*{complaint}"):
        EvaluateModelOperator(task_id="evaluate", launch=_launch_result(ref)).execute({})
    thread.join()
    assert [j["metadata"]["name"] for j in kube.objects("jobs", "airflow-tf/component=evaluate")] == [
        "tf-mnist-evaluate"], "the Job is kept, so its pod's log can be read"


def test_the_serving_command_refuses_a_bad_request_and_writes_its_result_to_the_result_file(
        capsys, tmp_path, monkeypatch):
    assert serving_main(["evaluate", "--request", "{not json"]) == 2
    assert "evaluate refused: --request: not JSON" in capsys.readouterr().err
    assert serving_main(["export", "--request", json.dumps({"run_dir": "/r"})]) == 2
    assert "missing dataset, training" in capsys.readouterr().err
    assert serving_main(["evaluate", "--request", f"@{tmp_path / 'missing.json'}"]) == 2
    assert "cannot read" in capsys.readouterr().err

    from airflow_tf.serving import requests

    exported = {"path": "/models/m/1", "version": 1, "model_name": "m"}
    monkeypatch.setitem(requests.COMMANDS, "export", lambda request: exported)  # no TensorFlow run here
    request = json.dumps({"run_dir": "/r", "dataset": "/d", "training": {}})
    assert serving_main(["export", "--request", request, "--result-file", str(tmp_path / "termination-log")]) == 0
    assert json.loads((tmp_path / "termination-log").read_text()) == exported
    assert capsys.readouterr().out == RESULT_MARKER + json.dumps(exported, sort_keys=True, separators=(",", ":")) + "\n"
