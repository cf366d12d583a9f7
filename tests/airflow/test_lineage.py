"""OpenLineage from the pipeline's operators, through the openlineage provider's own listener
and file transport: one DAG run of the example DAG (prepare -> launch -> evaluate -> export on
the local backend) read back as a lineage store would receive it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_tf.demo import dag_run_state, dags_test
from airflow_tf.operators.lineage import naming

DAG_ID = "tf_linear_regression"
NAMESPACE = "airflow-tf-lineage-test"
HOST = f"file://{socket.gethostname()}"


def test_a_local_path_is_named_by_host_and_absolute_path_and_an_object_store_uri_by_bucket_and_key(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert naming("data/in.csv") == (HOST, str(tmp_path / "data" / "in.csv"))
    assert naming(f"file://{tmp_path}/datasets/x/3/") == (HOST, f"{tmp_path}/datasets/x/3")
    assert naming("s3://Bucket-1/datasets/x/3/") == ("s3://Bucket-1", "datasets/x/3")
    assert naming("GS://bucket/models/m/2") == ("gs://bucket", "models/m/2")
    for bad in ("", "s3:///no-bucket"):
        with pytest.raises(ValueError, match="lineage"):
            naming(bad)


@pytest.mark.slow  # a Python that imports Airflow
def test_the_operators_work_and_emit_nothing_without_the_openlineage_provider(tmp_path):
    """An Airflow without the provider: the operators import and build, and the lineage methods
    (never called there by Airflow) answer None instead of failing."""
    script = textwrap.dedent("""
        import sys
        for name in ("airflow.providers.openlineage.extractors", "openlineage", "openlineage.client"):
            sys.modules[name] = None  # their import fails, as without the provider and its client
        from airflow_tf.operators import PrepareTFRecordsOperator
        op = PrepareTFRecordsOperator(task_id="p", input="/data/in.csv", name="d")
        print(op.get_openlineage_facets_on_start(), op.get_openlineage_facets_on_complete(None))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["None", "None"]


def test_prepare_names_its_raw_files_and_the_dataset_version_with_schema_and_row_counts(tmp_path):
    from airflow_tf.data import prepare_dataset
    from airflow_tf.data.samples import write_linear_regression_csv
    from airflow_tf.operators import PrepareTFRecordsOperator

    source = tmp_path / "in.csv"
    write_linear_regression_csv(source, rows=500, seed=0)
    op = PrepareTFRecordsOperator(task_id="p", input=str(tmp_path / "*.csv"), name="lin", label="y")
    started = op.get_openlineage_facets_on_start()
    assert [(d.namespace, d.name) for d in started.inputs] == [(HOST, str(tmp_path / "*.csv"))]
    assert started.outputs == []

    op._lineage_result = prepare_dataset(str(tmp_path / "*.csv"), tmp_path / "datasets", "lin", label="y",
                                         eval_fraction=0.2, cache=True)
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [(HOST, str(source))]  # the glob resolved
    (output,) = lineage.outputs
    assert (output.namespace, output.name) == (HOST, str(tmp_path / "datasets" / "lin" / "1"))
    assert output.outputFacets["outputStatistics"].rowCount == 500
    assert {f.name: f.type for f in output.facets["schema"].fields} == {"x": "float32", "y": "float32"}
    assert output.facets["version"].datasetVersion == "1"
    counts = output.facets["airflow_tf_dataset"].counts
    assert counts == op._lineage_result["counts"] and sum(counts.values()) == 500 and counts["eval"] > 0

    # The same input again: the cached version reused, named with the files it was made from.
    op._lineage_result = prepare_dataset(str(tmp_path / "*.csv"), tmp_path / "datasets", "lin", label="y",
                                         eval_fraction=0.2, cache=True)
    again = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in again.inputs] == [(HOST, str(source))]
    assert [(d.name, d.facets["airflow_tf_dataset"].cached) for d in again.outputs] == [(output.name, True)]


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a training group on a shared machine, as tests/airflow/test_load.py
def test_one_dag_run_emits_lineage_from_raw_data_to_the_model_version(airflow_home, tmp_path, group_processes):
    events_file = tmp_path / "openlineage.jsonl"
    env = dict(airflow_home.env, AIRFLOW_TF_STORAGE=str(tmp_path / "storage"),
               AIRFLOW_TF_STATE_DIR=str(tmp_path / "groups"), AIRFLOW__OPENLINEAGE__NAMESPACE=NAMESPACE,
               AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(
                   {"type": "file", "log_file_path": str(events_file), "append": True}))
    result = dags_test(env, DAG_ID, json.dumps({"steps": 1000, "rows": 2000}))
    (tmp_path / "dags-test.log").write_text(result.stdout)
    assert dag_run_state(result.stdout) == "success", result.stdout[-4000:]
    assert group_processes(tmp_path / "groups") == []
    assert_one_graph(_events(events_file), (tmp_path / "storage").resolve())


def assert_one_graph(events: list[dict], storage: Path) -> None:
    """The events of one run of the example DAG: START and COMPLETE per task, in order, naming raw
    file -> dataset version -> run directory -> model version, with row counts and metrics."""
    assert {e["job"]["namespace"] for e in events} == {NAMESPACE}
    tasks = [(e["job"]["name"].removeprefix(f"{DAG_ID}."), e["eventType"]) for e in events
             if e["job"]["name"] != DAG_ID]
    order = ["prepare", "training.launch", "training.evaluate", "training.export"]
    ours = [t for t in tasks if t[0] in order]
    assert ours == [(task, kind) for task in order for kind in ("START", "COMPLETE")], tasks
    run_ids = {e["run"]["facets"]["parent"]["run"]["runId"] for e in events if e["job"]["name"] != DAG_ID}
    dag_runs = [e for e in events if e["job"]["name"] == DAG_ID]
    assert events[-1] in dag_runs and events[-1]["eventType"] == "COMPLETE"
    assert run_ids == {e["run"]["runId"] for e in dag_runs}, "the tasks' events name the DAG run as their parent"

    def complete(task):
        (event,) = [e for e in events if e["job"]["name"] == f"{DAG_ID}.{task}" and e["eventType"] == "COMPLETE"]
        return event

    raw = storage / "incoming" / "linear_regression" / "seed.csv"
    version = storage / "datasets" / "linear_regression" / "1"
    run_dir = Path(complete("training.launch")["outputs"][0]["name"])

    prepare = complete("prepare")
    assert [(d["namespace"], d["name"]) for d in prepare["inputs"]] == [(HOST, str(raw))]
    (dataset,) = prepare["outputs"]
    assert (dataset["namespace"], dataset["name"]) == (HOST, str(version))
    assert dataset["outputFacets"]["outputStatistics"]["rowCount"] == 2000
    counts = dataset["facets"]["airflow_tf_dataset"]["counts"]
    assert sorted(counts) == ["eval", "train"] and sum(counts.values()) == 2000
    assert [f["name"] for f in dataset["facets"]["schema"]["fields"]] == ["x", "y"]
    assert dataset["facets"]["version"]["datasetVersion"] == "1"

    (started,) = [e for e in events if e["job"]["name"] == f"{DAG_ID}.training.launch" and e["eventType"] == "START"]
    assert [(d["namespace"], d["name"]) for d in started["inputs"]] == [(HOST, str(version))]
    assert started["run"]["facets"]["airflow_tf_training"]["shape"] == {"ps": 1, "workers": 2, "chief": 0}
    launch = complete("training.launch")
    assert [(d["namespace"], d["name"]) for d in launch["inputs"]] == [(HOST, str(version))]
    assert run_dir.parent == storage / "runs" and launch["outputs"][0]["namespace"] == HOST
    training = launch["run"]["facets"]["airflow_tf_training"]
    assert training["shape"] == {"ps": 1, "workers": 2, "chief": 0}
    assert training["options"]["steps"] == 1000 and training["options"]["model"] == "linear_regression"
    assert training["group"]["backend"] == "local"

    evaluate = complete("training.evaluate")
    assert [(d["namespace"], d["name"]) for d in evaluate["inputs"]] == [(HOST, str(run_dir)), (HOST, str(version))]
    evaluation = evaluate["inputs"][0]["facets"]["airflow_tf_evaluation"]
    assert evaluation["blessed"] is True and evaluation["examples"] == counts["eval"]
    assert 0 <= evaluation["metrics"]["mse"] <= 1.0
    (check,) = evaluate["inputs"][0]["facets"]["dataQualityAssertions"]["assertions"]
    assert (check["assertion"], check["success"], check["column"]) == ("mse max 1.0", True, "mse")

    export = complete("training.export")
    assert [(d["namespace"], d["name"]) for d in export["inputs"]] == [(HOST, str(run_dir))]
    (model,) = export["outputs"]
    assert (model["namespace"], model["name"]) == (HOST, str(storage / "models" / "linear_regression" / "1"))
    assert model["facets"]["version"]["datasetVersion"] == "1"
    exported = model["facets"]["airflow_tf_model"]
    assert exported["model_name"] == "linear_regression" and exported["version"] == 1
    assert exported["blessed"] is True and exported["metrics"]["mse"] == evaluation["metrics"]["mse"]
