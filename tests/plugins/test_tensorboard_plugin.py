"""The provider's Airflow plugin: discovered through its entry point, TensorBoard mounted behind
Airflow's authentication over the storage's runs/, the launch link and the DAG-run view.

The ASGI tests drive the plugin's mounted app with Starlette's TestClient and the real auth
manager of this Airflow (the simple auth manager, JWTs signed with a test secret)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import unquote

import pytest
from starlette.testclient import TestClient

from airflow_tf.plugins.links import run_name, scalars_url
from airflow_tf.plugins.tensorboard import TensorBoardApp, TensorBoardPlugin, build_tensorboard

AIRFLOW = str(Path(sys.executable).with_name("airflow"))


def test_airflow_plugins_manager_finds_the_plugin_through_the_entry_point(tmp_path):
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path / "home"), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    result = subprocess.run([AIRFLOW, "plugins", "--output", "json"], env=env, text=True, capture_output=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout[result.stdout.index("["):])}
    assert "airflow_tf" in plugins, f"plugins found: {sorted(plugins)}"
    plugin = plugins["airflow_tf"]
    assert "airflow_tf.plugins.tensorboard:TensorBoardPlugin" in str(plugin["source"]) or plugin["source"]
    assert [app["url_prefix"] for app in plugin["fastapi_apps"]] == ["/tensorboard"]
    assert [(v["name"], v["destination"]) for v in plugin["external_views"]] == [("TensorBoard", "dag_run")]
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


@pytest.fixture
def auth(monkeypatch, tmp_path):
    """The simple auth manager with a test JWT secret; ``auth.token(role)`` signs a user's token."""
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "tensorboard-plugin-test-secret")
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER",
                       "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    from airflow.api_fastapi import app as api_app
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    monkeypatch.setattr(api_app._AuthManagerState, "instance", None)
    manager = api_app.create_auth_manager()

    class Auth:
        @staticmethod
        def token(role: str = "admin") -> str:
            return manager.generate_jwt(SimpleAuthManagerUser(username="alice", role=role))

    yield Auth
    monkeypatch.setattr(api_app._AuthManagerState, "instance", None)


@pytest.fixture
def storage(monkeypatch, tmp_path):
    root = tmp_path / "storage"
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TF__STORAGE", str(root))
    return root


def write_training_events(run_dir: Path) -> None:
    """Event files as the runtime writes them (tf.compat.v1 FileWriter, tags loss/examples_per_sec/
    learning_rate), in a separate process as the training tasks do."""
    code = textwrap.dedent(f"""
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()  # the runtime trains in graph mode
        writer = tf.compat.v1.summary.FileWriter({str(run_dir)!r})
        for step in range(0, 50, 10):
            values = [tf.compat.v1.Summary.Value(tag="loss", simple_value=10.0 / (step + 1)),
                      tf.compat.v1.Summary.Value(tag="learning_rate", simple_value=0.01)]
            writer.add_summary(tf.compat.v1.Summary(value=values), step)
        writer.close()
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
    assert list(run_dir.glob("events.out.tfevents.*"))


def test_requests_without_a_valid_token_are_refused_before_tensorboard_is_built(auth, storage):
    built = []
    app = TensorBoardApp(factory=lambda logdir: built.append(logdir))
    with TestClient(app, base_url="http://airflow/tensorboard", root_path="/tensorboard") as client:
        assert client.get("/data/runs").status_code == 401
        assert client.get("/data/runs", headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
        client.cookies.set("_token", "not-a-jwt")
        assert client.get("/data/runs").status_code == 403
        client.cookies.clear()
        assert client.get("/airflow/dag-run?dag_id=d&run_id=r").status_code == 401
    assert built == []  # nothing of TensorBoard was built or shown


@pytest.mark.slow
def test_signed_in_user_reads_the_runs_scalars_through_the_mounted_app(auth, storage):
    run_dir = storage / "runs" / "tf-linear-train-0123456789"
    write_training_events(run_dir)
    app = TensorBoardApp()
    with TestClient(app, base_url="http://airflow/tensorboard", root_path="/tensorboard") as client:
        refused = client.get("/data/plugin/scalars/tags")
        assert refused.status_code == 401
        client.cookies.set("_token", auth.token())  # the UI's session cookie
        tags = client.get("/data/plugin/scalars/tags")
        assert tags.status_code == 200, tags.text
        assert "loss" in tags.json()[run_dir.name]
        header = {"Authorization": f"Bearer {auth.token('viewer')}"}
        client.cookies.clear()
        scalars = client.get("/data/plugin/scalars/scalars", params={"run": run_dir.name, "tag": "loss"},
                             headers=header)
        assert scalars.status_code == 200, scalars.text
        assert [row[1] for row in scalars.json()] == [0, 10, 20, 30, 40]
        page = client.get("/", headers=header)
        assert page.status_code == 200 and "<tf-tensorboard" in page.text or "tensorboard" in page.text.lower()


def test_without_tensorboard_installed_the_mount_explains_how_to_enable_it(auth, storage, monkeypatch):
    # The import failure is simulated inside the real factory: tensorboard is installed here.
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    app = TensorBoardApp()
    with TestClient(app, base_url="http://airflow/tensorboard", root_path="/tensorboard") as client:
        assert client.get("/").status_code == 401
        page = client.get("/", headers={"Authorization": f"Bearer {auth.token()}"})
    assert page.status_code == 503
    assert 'pip install "airflow-tf[tensorboard]"' in page.text.replace("&quot;", '"')
    assert str(storage / "runs") in page.text


def test_the_plugin_mounts_one_lazy_app_and_builds_tensorboard_only_when_asked():
    [mount] = TensorBoardPlugin.fastapi_apps
    assert mount["url_prefix"] == "/tensorboard" and isinstance(mount["app"], TensorBoardApp)
    assert "tensorboard" not in sys.modules or build_tensorboard  # importing the plugin imports no TensorBoard
    code = "import sys, airflow_tf.plugins.tensorboard, airflow_tf.operators.launch; " \
           "print(sorted(m for m in ('tensorboard', 'tensorflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]"
