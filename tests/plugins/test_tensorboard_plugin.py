"""The provider's Airflow plugin: discovered through its entry point, TensorBoard mounted behind
Airflow's authentication over the storage's runs/, the launch link and the DAG-run view.

The ASGI tests drive the plugin's mounted app with Starlette's TestClient and the real auth
manager (the simple auth manager, JWTs signed with a test secret) of an Airflow home with its own
metadata database, in a separate process (tests/plugins/mounted_app.py)."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import unquote

import pytest
from airflow_tf.demo import airflow_env
from airflow_tf.plugins.links import run_name, scalars_url
from airflow_tf.plugins.tensorboard import TensorBoardApp, TensorBoardPlugin

HERE = Path(__file__).parent

AIRFLOW = str(Path(sys.executable).with_name("airflow"))


def test_airflow_plugins_manager_finds_the_plugin_through_the_entry_point(tmp_path):
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path / "home"), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    result = subprocess.run([AIRFLOW, "plugins", "--output", "json"], env=env, text=True, capture_output=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout[result.stdout.index("["):])}
    assert "airflow_tf" in plugins, f"plugins found: {sorted(plugins)}"
    plugin = plugins["airflow_tf"]
    # Loaded from the distribution's entry point (not a plugins folder).
    assert "value='airflow_tf.plugins.tensorboard:TensorBoardPlugin', group='airflow.plugins'" in plugin["source"]
    assert [app["url_prefix"] for app in plugin["fastapi_apps"]] == ["/tensorboard", "/training"]
    assert [(v["name"], v["destination"]) for v in plugin["external_views"]] == [
        ("Training", "nav"), ("TensorBoard", "dag_run")]
    assert any("TensorBoardLink" in link for link in plugin["operator_extra_links"])


def test_run_names_and_scalars_urls(tmp_path):
    runs = str(tmp_path / "runs")
    assert run_name(f"{runs}/tf-train-abc", runs) == "tf-train-abc"
    assert run_name(f"file://{runs}/nested/tf-x", runs) == "nested/tf-x"
    assert run_name(str(tmp_path / "elsewhere" / "tf-x"), runs) is None  # TensorBoard does not see it
    assert run_name(runs, runs) is None
    url = scalars_url(["tf-a.b", "tf-c"], "http://airflow:8080/tensorboard")
    assert url.startswith("http://airflow:8080/tensorboard/?runFilter=") and url.endswith("#timeseries")
    assert unquote(url.split("runFilter=")[1].split("#")[0]) == r"^(tf\-a\.b|tf\-c)(/|$)"
    assert scalars_url([]) == "/tensorboard/#timeseries"


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory, migrated_airflow_db):
    """An Airflow home with its metadata database (token checks consult revoked tokens there)."""
    root = tmp_path_factory.mktemp("airflow")
    (root / "dags").mkdir()
    env = airflow_env(root, root / "dags")
    env["AIRFLOW__API_AUTH__JWT_SECRET"] = "tensorboard-plugin-test-secret-" + "x" * 40
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = "False"
    migrated_airflow_db(env)
    return env


def ask(env: dict, requests: list[dict], storage: Path, *flags: str) -> list[dict]:
    """The mounted app's answers to ``requests`` (see tests/plugins/mounted_app.py)."""
    env = dict(env, AIRFLOW__AIRFLOW_TF__STORAGE=str(storage))
    result = subprocess.run([sys.executable, str(HERE / "mounted_app.py"), json.dumps(requests), *flags],
                            env=env, text=True, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_training_events(run_dir: Path) -> None:
    """Event files as the runtime writes them (tf.compat.v1 FileWriter in graph mode, tags loss and
    learning_rate), in a separate process as the training tasks do."""
    code = textwrap.dedent(f"""
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        writer = tf.compat.v1.summary.FileWriter({str(run_dir)!r})
        for step in range(0, 50, 10):
            values = [tf.compat.v1.Summary.Value(tag="loss", simple_value=10.0 / (step + 1)),
                      tf.compat.v1.Summary.Value(tag="learning_rate", simple_value=0.01)]
            writer.add_summary(tf.compat.v1.Summary(value=values), step)
        writer.close()
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, capture_output=True,
                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
    assert list(run_dir.glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_signed_in_user_reads_the_runs_scalars_and_others_are_refused(airflow_home, tmp_path):
    storage = tmp_path / "storage"
    run = "tf-linear-train-0123456789"
    write_training_events(storage / "runs" / run)
    scalars = {"path": "/data/plugin/scalars/scalars", "params": {"run": run, "tag": "loss"}}
    answers = ask(airflow_home, [
        {"path": "/data/plugin/scalars/tags"},
        {"path": "/data/plugin/scalars/tags", "auth": "bad"},
        {"path": "/data/plugin/scalars/tags", "auth": "bad", "via": "cookie"},
        {"path": "/airflow/dag-run", "params": {"dag_id": "d", "run_id": "r"}},
        {"path": "/data/plugin/scalars/tags", "auth": "admin", "via": "cookie"},
        {**scalars, "auth": "viewer"},
        {"path": "/", "auth": "viewer"},
        {"path": "/data/logdir", "auth": "viewer"},
        {"path": "/data/environment", "auth": "viewer"},
    ], storage)
    assert [a["status"] for a in answers[:4]] == [401, 403, 403, 401]
    assert all("tensorboard" not in str(a["body"]).lower() for a in answers[:4])
    tags, curve, page, logdir, environment = answers[4:]
    # Where the storage is stays on the server.
    assert logdir == {"status": 200, "body": {"logdir": ""}, "location": None}, logdir
    assert environment["status"] == 200 and environment["body"]["data_location"] == "", environment
    assert str(tmp_path) not in json.dumps(environment["body"])
    assert tags["status"] == 200 and "loss" in tags["body"][run], tags
    assert curve["status"] == 200 and [row[1] for row in curve["body"]] == [0, 10, 20, 30, 40], curve
    assert page["status"] == 200 and "<tb-webapp>" in page["body"], str(page)[:500]


@pytest.mark.slow
def test_without_tensorboard_installed_the_mount_explains_how_to_enable_it(airflow_home, tmp_path):
    storage = tmp_path / "storage"
    refused, page = ask(airflow_home, [{"path": "/"}, {"path": "/", "auth": "admin"}], storage,
                        "--without-tensorboard")
    assert refused["status"] == 401
    assert page["status"] == 503
    assert 'pip install "airflow-tf[tensorboard]"' in html.unescape(page["body"])
    assert str(storage / "runs") in page["body"]


def test_the_plugin_mounts_one_lazy_app_and_builds_tensorboard_only_when_asked():
    mount, _ = TensorBoardPlugin.fastapi_apps
    assert mount["url_prefix"] == "/tensorboard" and isinstance(mount["app"], TensorBoardApp)
    code = "import sys, airflow_tf.plugins.tensorboard, airflow_tf.operators.launch; " \
           "print(sorted(m for m in ('tensorboard', 'tensorflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]"


SEED_LAUNCHES = """
import json, sys
from datetime import datetime, timezone
from airflow.models.dag import DagModel
from airflow.models.dagbundle import DagBundleModel
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

from sqlalchemy import text

rows = json.loads(sys.argv[1])
with create_session() as session:
    session.execute(text("PRAGMA foreign_keys=OFF"))  # results of DAG runs that exist in XCom only
    session.add(DagBundleModel(name="tests"))
    for dag_id in sorted({row["dag_id"] for row in rows}):
        session.add(DagModel(dag_id=dag_id, bundle_name="tests"))
    session.flush()
    for number, row in enumerate(rows, 1):
        session.add(XComModel(dag_run_id=number, key="return_value", map_index=-1, timestamp=datetime.now(timezone.utc),
                              value=json.dumps(row.pop("value")), **row))
"""


@pytest.mark.slow
def test_a_malformed_launch_result_fails_no_view(tmp_path, migrated_airflow_db):
    """Results any task can return, shaped like a launch's but malformed, are skipped: the
    Training view, TensorBoard and the DAG-run view answer as before for everyone."""
    from airflow_tf.backends.ownership import RunLaunch, claim_run_dir

    root = tmp_path / "airflow"
    (root / "dags").mkdir(parents=True)
    env = airflow_env(root, root / "dags")
    env["AIRFLOW__API_AUTH__JWT_SECRET"] = "tensorboard-plugin-test-secret-" + "x" * 40
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = "False"
    migrated_airflow_db(env)
    storage = tmp_path / "storage"
    good = storage / "runs" / "tf-good"
    claim_run_dir(good, RunLaunch("tf_good", "manual__1", "training.launch", -1))
    (good / "progress.json").write_text(json.dumps({"global_step": 7, "target_step": 10}))
    shaped = {"group": {"backend": "local", "name": "tf-good"}, "run_dir": str(good), "dataset": "/d", "training": {}}
    malformed = [{"run_dir": 123}, {"run_dir": "relative/tf-x"}, {"group": "tf-x"}, {"group": {}},
                 {"run_dir": f"{good}/../tf-good"}, {"map_index": "first"}, {"training": None}]
    rows = [{"dag_id": "tf_good", "run_id": "manual__1", "task_id": "training.launch", "value": shaped}]
    rows += [{"dag_id": "tf_bad", "run_id": f"manual__{n}", "task_id": "launch", "value": {**shaped, **change}}
             for n, change in enumerate(malformed)]
    seeded = subprocess.run([sys.executable, "-c", SEED_LAUNCHES, json.dumps(rows)], env=env, text=True,
                            capture_output=True, timeout=300)
    assert seeded.returncode == 0, seeded.stderr[-3000:]

    [groups] = ask(env, [{"path": "/api/groups", "auth": "admin"}], storage, "--mount=/training")
    assert groups["status"] == 200, groups
    assert [(g["dag_id"], g["group"], g["global_step"]) for g in groups["body"]["groups"]] == [
        ("tf_good", "tf-good", 7)]
    dag_run, runs = ask(env, [
        {"path": "/airflow/dag-run", "params": {"dag_id": "tf_good", "run_id": "manual__1"}, "auth": "admin"},
        {"path": "/data/runs", "auth": "viewer"},
    ], storage)
    assert dag_run["status"] == 307 and "tf%5C-good" in dag_run["location"], dag_run
    assert runs["status"] == 200, runs
