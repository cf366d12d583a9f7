"""``airflow-tf prepare -> run -> evaluate -> export`` in a temporary directory, without
Airflow: each command is a real process that cannot import Airflow (imports of ``airflow`` are
refused), trains a real local group and publishes a SavedModel that answers like TF Serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_tf.cli import NOT_EXPORTED
from airflow_tf.data.samples import write_linear_regression_csv
from airflow_tf.demo import predict

pytestmark = pytest.mark.slow

# The command line as a user without Airflow has it: any import of airflow fails.
WITHOUT_AIRFLOW = """
import sys
class NoAirflow:
    def find_spec(self, name, path=None, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError(f"{name}: Airflow is not installed here")
sys.meta_path.insert(0, NoAirflow())
from airflow_tf.cli import main
sys.exit(main(sys.argv[1:]))
"""


def airflow_tf(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(workdir), "AIRFLOW_TF_STATE_DIR": str(workdir / "groups"),
           "AIRFLOW_TF_STORAGE": str(workdir / "storage")}
    return subprocess.run([sys.executable, "-c", WITHOUT_AIRFLOW, *args], cwd=workdir, env=env, text=True,
                          capture_output=True, timeout=600)


def ok(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_prepare_run_evaluate_export_without_airflow(tmp_path, group_processes):
    write_linear_regression_csv(tmp_path / "linear.csv", rows=3000, seed=2)
    prepared = ok(airflow_tf(tmp_path, "prepare", "--input", "linear.csv", "--output", "datasets", "--name", "linear",
                             "--label", "y", "--shards", "2", "--quiet"))
    run = ok(airflow_tf(tmp_path, "run", "--dataset", prepared["dataset_uri"], "--run-dir", "runs/first",
                        "--ps", "1", "--workers", "2", "--steps", "800", "--learning-rate", "0.05"))
    assert run["succeeded"], run
    run_dir = tmp_path / "runs" / "first"
    assert json.loads((run_dir / "launch.json").read_text())["training"]["steps"] == 800

    # Evaluate, as EvaluateModelOperator: metrics.json and the curve in the run dir, the result on stdout.
    evaluated = airflow_tf(tmp_path, "evaluate", "--run-dir", "runs/first", "--thresholds", '{"mse": {"max": 1.0}}')
    evaluation = ok(evaluated)
    assert evaluation["blessed"] and evaluation["metrics"]["mse"] < 1.0, evaluation
    assert "model BLESSED" in evaluated.stderr
    assert json.loads((run_dir / "metrics.json").read_text())["blessed"] is True
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation))

    # Export, as ExportSavedModelOperator: version 1 under the serving base, answering like TF Serving.
    exported = ok(airflow_tf(tmp_path, "export", "--run-dir", "runs/first", "--model-name", "linear",
                             "--serving-base", "models", "--metrics", "@evaluation.json"))
    assert exported["version"] == 1 and Path(exported["path"]) == tmp_path / "models" / "linear" / "1"
    predictions = predict(exported["path"], {"x": [0.0, 1.0]})
    assert predictions == pytest.approx([10.0, 12.0], abs=0.5), predictions

    # A stricter threshold: not blessed; the export is skipped (its own exit status), no version 2.
    strict = ok(airflow_tf(tmp_path, "evaluate", "--run-dir", "runs/first", "--thresholds", '{"mse": {"max": 1e-9}}'))
    assert not strict["blessed"] and strict["reasons"], strict
    skipped = airflow_tf(tmp_path, "export", "--run-dir", "runs/first", "--model-name", "linear",
                         "--serving-base", "models")
    assert skipped.returncode == NOT_EXPORTED, skipped.stderr
    assert "not exported" in skipped.stderr and "not blessed" in skipped.stderr.lower()
    failed = airflow_tf(tmp_path, "export", "--run-dir", "runs/first", "--model-name", "linear",
                        "--serving-base", "models", "--on-unblessed", "fail")
    assert failed.returncode == 1
    assert sorted(os.listdir(tmp_path / "models" / "linear")) == ["1"], "no version of an unblessed model"

    # Compared with the served model (version 1, the same checkpoint): at least as good, blessed.
    compared = ok(airflow_tf(tmp_path, "evaluate", "--run-dir", "runs/first", "--compare-to-served",
                             "--model-name", "linear", "--serving-base", "models"))
    assert compared["blessed"] and compared["baseline"], compared
    assert not group_processes(tmp_path / "groups"), "no process of the group is left"


USER_MODEL = """
import keras


def build():
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
"""


def test_the_tutorials_commands_with_a_model_of_the_users(tmp_path, group_processes):
    """getting-started's chain, run as written with the venv's ``airflow-tf`` and a model module in
    the current directory (own-model): evaluate's output, redirected to a file, is the JSON export
    reads, though the evaluation logs where the model's code came from."""
    command = Path(sys.executable).with_name("airflow-tf")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AIRFLOW_TF_STATE_DIR": str(tmp_path / "groups")}

    def airflow_tf_to(stdout, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([command, *args], cwd=tmp_path, env=env, text=True, stdout=stdout,
                              stderr=subprocess.PIPE, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    def result(*args: str) -> dict:
        done = airflow_tf_to(subprocess.PIPE, *args)
        return json.loads(done.stdout)  # the whole of stdout: the result alone

    (tmp_path / "my_model.py").write_text(USER_MODEL)
    write_linear_regression_csv(tmp_path / "linear.csv", rows=2000, seed=3)
    prepared = result("prepare", "--input", "linear.csv", "--output", "data", "--name", "linear", "--label", "y")
    assert prepared["dataset_uri"] == str(tmp_path / "data" / "linear" / "1")
    run = result("run", "--dataset", "data/linear/1", "--model", "my_model:build", "--ps", "1", "--workers", "2",
                 "--steps", "300", "--learning-rate", "0.1", "--run-dir", "runs/linear")
    assert run["succeeded"], run
    with open(tmp_path / "evaluation.json", "w") as evaluation:
        evaluated = airflow_tf_to(evaluation, "evaluate", "--run-dir", "runs/linear",
                                  "--thresholds", '{"mse": {"max": 1.0}}')
    assert "airflow-tf model code my_model from" in evaluated.stderr, "the log line is on stderr"
    assert json.loads((tmp_path / "evaluation.json").read_text())["blessed"]
    exported = result("export", "--run-dir", "runs/linear", "--model-name", "linear", "--serving-base", "models",
                      "--metrics", "@evaluation.json")
    assert exported["path"] == str(tmp_path / "models" / "linear" / "1")
    assert predict(exported["path"], {"x": [0.0, 1.0]}) == pytest.approx([10.0, 12.0], abs=0.5)
    assert not group_processes(tmp_path / "groups"), "no process of the group is left"


def test_evaluate_names_what_is_missing(tmp_path):
    done = airflow_tf(tmp_path, "evaluate", "--run-dir", "nowhere")
    assert done.returncode != 0 and "nowhere/launch.json does not exist" in done.stderr
    assert "--launch" in done.stderr
    done = airflow_tf(tmp_path, "evaluate", "--run-dir", "nowhere", "--thresholds", "{not json")
    assert done.returncode == 2 and "argument --thresholds: '{not json' is not JSON (Expecting property name enclosed in double quotes at " \
        "character 2); expected an object of metric bounds" in done.stderr


def test_zlib_compressed_dataset_through_training_and_evaluation(tmp_path, group_processes):
    """ZLIB, TFRecord's other compression: every shard is one zlib stream (TensorFlow's reader
    stops at the end of the first stream), so the workers and the evaluation see every record."""
    write_linear_regression_csv(tmp_path / "linear.csv", rows=20000, seed=5)
    prepared = ok(airflow_tf(tmp_path, "prepare", "--input", "linear.csv", "--output", "datasets", "--name", "linear",
                             "--label", "y", "--shards", "2", "--compression", "zlib", "--buffer-mib", "4", "--quiet"))
    assert prepared["compression"] == "zlib"
    shards = sorted((Path(prepared["dataset_uri"]) / "train").iterdir())
    assert [p.name for p in shards] == ["part-00000-of-00002.tfrecord.zlib", "part-00001-of-00002.tfrecord.zlib"]
    run = ok(airflow_tf(tmp_path, "run", "--dataset", prepared["dataset_uri"], "--run-dir", "runs/zlib",
                        "--ps", "1", "--workers", "2", "--steps", "600", "--learning-rate", "0.05"))
    assert run["succeeded"], run
    evaluation = ok(airflow_tf(tmp_path, "evaluate", "--run-dir", "runs/zlib", "--thresholds", '{"mse": {"max": 1.0}}'))
    # Every held-out record was read and parsed (a truncated stream would give fewer, or fail).
    assert evaluation["examples"] == prepared["counts"]["eval"] > 3500, evaluation
    assert evaluation["blessed"] and evaluation["metrics"]["mse"] < 1.0, evaluation
