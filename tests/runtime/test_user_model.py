"""A user's own model: the function's arguments, how the dataset's features reach its inputs,
its output checked against the label before training, and its code imported from the run's
snapshot; and the seed's own Sequential model trained by ``airflow-tf run`` from a folder that
only the launcher has on its import path."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from airflow_tf.cluster import TrainingConfig
from airflow_tf.cluster.model_code import CODE_DIR, snapshot_model_code
from airflow_tf.data.schema import FeatureSpec, Schema
from airflow_tf.runtime import models

MODELS = '''
import keras

def seed_model():
    """The seed's model: one input, no arguments."""
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])

def five_outputs():
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(5)])

def one_output(units=1):
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(units)])

def matrix(width=5):
    return keras.Sequential([keras.Input((width,)), keras.layers.Dense(1, use_bias=False)])

def flat_input():
    x = keras.Input(())
    return keras.Model(x, keras.layers.Dense(1)(keras.ops.expand_dims(x, -1)))

def two_inputs():
    a, b = keras.Input((3,), name="pixels"), keras.Input((2,), name="extra")
    return keras.Model([a, b], keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))

def named(schema, units):
    x, v = keras.Input((1,), name="x"), keras.Input((3,), name="v")
    return keras.Model({"x": x, "v": v}, keras.layers.Dense(units)(keras.layers.Concatenate()([x, v])))

class ByName(keras.Model):
    def __init__(self, feature):
        super().__init__()
        self.feature, self.dense = feature, keras.layers.Dense(1)

    def call(self, features):
        return self.dense(keras.ops.expand_dims(features[self.feature], -1))

def subclassed(feature="x"):
    return ByName(feature)

def everything(**kwargs):
    assert "schema" in kwargs, "a **kwargs function gets the schema too"
    return keras.Sequential([keras.layers.Dense(kwargs.get("units", 1))])
'''

MIXED = Schema((FeatureSpec("x", "float32"), FeatureSpec("v", "float32", (3,)), FeatureSpec("k", "int64"),
                FeatureSpec("y", "float32")), label_name="y")
LINE = Schema((FeatureSpec("x", "float32"), FeatureSpec("y", "float32")), label_name="y")
CLASSES = Schema((FeatureSpec("a", "float32", (2,)), FeatureSpec("label", "int64")), label_name="label")


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "user_models.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_models"
    sys.modules.pop("user_models", None)


def build(function: str, schema: Schema, **options):
    config = TrainingConfig(dataset="/data/ds/1", run_dir="/runs/r", steps=10, model=f"user_models:{function}",
                            **options)
    return models.build_model(config, schema)


def batch(schema: Schema, rows: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {name: rng.integers(0, 5, size=(rows, *schema[name].shape)).astype(schema[name].dtype)
            for name in schema.feature_names}


def test_a_no_argument_single_input_model_gets_the_one_feature(user_models):
    model = build("seed_model", LINE)
    model.set_weights([np.array([[2.0]], np.float32), np.array([10.0], np.float32)])
    prediction = model({"x": np.array([1.0, -0.5], np.float32)}).numpy()
    np.testing.assert_allclose(prediction[:, 0], [12.0, 9.0])
    assert [w.name for w in model.weights] == ["kernel", "bias"], "the checkpoint holds the user's weights only"


def test_several_numeric_features_feed_a_one_input_model_as_a_matrix_in_schema_order(user_models):
    model = build("matrix", MIXED)
    model.set_weights([np.arange(1, 6, dtype=np.float32).reshape(5, 1)])
    features = batch(MIXED)
    expected = (features["x"] * 1 + features["v"] @ np.array([2, 3, 4]) + features["k"] * 5).astype(np.float32)
    np.testing.assert_allclose(model(features).numpy()[:, 0], expected)


ROWS = Schema((*(FeatureSpec(f"f{i}", "float32") for i in range(5)), FeatureSpec("y", "float32")), label_name="y")


@pytest.mark.parametrize("function, schema, takes_rows", [
    ("matrix", ROWS, True),  # five float32 scalars: the batch's rows go to the user's model as they are
    ("matrix", MIXED, False),  # a vector and an int64 feature: joined as before
    ("seed_model", LINE, False),  # one feature: nothing to join
    ("subclassed", ROWS, False),  # a model without declared inputs takes the dict
])
def test_a_one_input_model_is_fed_whole_rows_when_every_feature_is_a_float_scalar(user_models, function, schema,
                                                                                    takes_rows):
    model = build(function, schema, **({"model_kwargs": {"feature": "f0"}} if function == "subclassed" else {}))
    on_rows = models.matrix_model(model, schema, f"user_models:{function}")
    assert (on_rows is not None) == takes_rows
    if takes_rows:
        features = batch(schema)
        rows = np.stack([features[name] for name in schema.feature_names], axis=1)
        np.testing.assert_allclose(on_rows(rows).numpy(), model(features).numpy())
        assert [id(w) for w in on_rows.weights] == [id(w) for w in model.weights], "the same weights, not copies"


def test_a_one_input_model_declared_flat_gets_a_flat_feature(user_models):
    model = build("flat_input", LINE)
    assert model(batch(LINE)).shape == (4, 1)


def test_inputs_named_after_features_get_them_reshaped_and_the_model_its_kwargs(user_models):
    model = build("named", MIXED, model_kwargs={"units": 1})  # x is a scalar feature, its input (1,)
    assert model(batch(MIXED)).shape == (4, 1)
    assert build("everything", MIXED)(batch(MIXED)).shape == (4, 1)
    with pytest.raises(models.ModelError, match=r"model 'user_models:named': model_kwargs \{\} do not fit its "
                                                r"arguments \(schema, units\) \(missing a required argument: "
                                                r"'units'\)"):
        build("named", MIXED)


def test_a_subclassed_model_gets_the_features_dict_and_a_wrong_key_is_refused_before_training(user_models):
    assert build("subclassed", MIXED)(batch(MIXED)).shape == (4, 1)
    with pytest.raises(models.ModelError, match=r"model 'user_models:subclassed' fails on the dataset's features "
                                                r"\(x \(None,\) float32\): KeyError: 'z'"):
        build("subclassed", LINE, model_kwargs={"feature": "z"})


def test_a_model_that_cannot_take_the_features_is_refused_listing_inputs_and_features(user_models):
    with pytest.raises(models.ModelError) as refused:
        build("two_inputs", MIXED)
    message = str(refused.value)
    assert "model 'user_models:two_inputs' cannot take this dataset's features" in message
    assert "The model's inputs: pixels (None, 3) float32, extra (None, 2) float32." in message
    assert ("The dataset's features: x (None,) float32, v (None, 3) float32, k (None,) int64 "
            "(and the label 'y')") in message
    assert "all numeric features as one float matrix (None, 5) in schema order" in message
    # One input of the wrong width: two values where the dataset has five.
    with pytest.raises(models.ModelError, match=r"inputs: \S+ \(None, 2\) float32\. The dataset's features: x"):
        build("one_output", MIXED)


def test_an_output_that_does_not_fit_the_label_is_refused_naming_both_shapes(user_models):
    with pytest.raises(models.ModelError, match=r"model 'user_models:five_outputs' outputs \(None, 5\) but "
                                                r"label 'y' "
                                                r"is a scalar float32: with the loss mean_squared_error the model must "
                                                r"output \(None,\) or \(None, 1\)"):
        build("five_outputs", LINE)
    with pytest.raises(models.ModelError, match=r"outputs \(None, 1\) but label 'label' is a scalar int64, a class "
                                                r"index for the loss sparse_categorical_crossentropy: the model must "
                                                r"output \(None, num_classes\)"):
        build("one_output", CLASSES)
    assert build("one_output", CLASSES, model_kwargs={"units": 3})(batch(CLASSES)).shape == (4, 3)
    assert build("one_output", CLASSES, loss="mean_squared_error")(batch(CLASSES)).shape == (4, 1)


def test_the_model_is_imported_from_the_run_snapshot_before_any_other_copy(tmp_path, monkeypatch, request):
    dags, stale = tmp_path / "dags", tmp_path / "stale"
    dags.mkdir()
    stale.mkdir()
    (dags / "snap_model.py").write_text(MODELS.replace("def seed_model", "NAME = 'snapshot'\n\ndef seed_model"))
    (stale / "snap_model.py").write_text("NAME = 'stale'\n")
    monkeypatch.setattr(sys, "path", [str(stale), *sys.path])
    request.addfinalizer(lambda: sys.modules.pop("snap_model", None))
    import snap_model  # an older copy, imported before (an Airflow worker that parsed the DAG)

    assert snap_model.NAME == "stale"
    code = snapshot_model_code("snap_model:seed_model", str(tmp_path / "run"), [str(dags)])
    config = TrainingConfig(dataset="/d", run_dir=str(tmp_path / "run"), steps=1, model="snap_model:seed_model",
                            code_dir=code.path)
    assert models.build_model(config, LINE).weights
    assert sys.modules["snap_model"].NAME == "snapshot"
    assert sys.modules["snap_model"].__file__ == os.path.join(code.path, "snap_model.py")

    missing = TrainingConfig(dataset="/d", run_dir="/r", steps=1, model="snap_model:seed_model",
                             code_dir=str(tmp_path / "not-mounted"))
    with pytest.raises(models.ModelError, match="not-mounted does not exist: .* the same shared storage"):
        models.build_model(missing, LINE)


@pytest.mark.slow
def test_the_seeds_sequential_model_next_to_a_dag_trains_through_airflow_tf_run(linear_dataset, local_state_dir,
                                                                              tmp_path, group_processes):
    # The model lives in a folder only the launcher has on sys.path (as Airflow's DAGs folder):
    # no PYTHONPATH, so the tasks can import it only from the run directory's snapshot.
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "seed_dag_model.py").write_text(MODELS)
    driver = tmp_path / "driver" / "launch.py"
    driver.parent.mkdir()
    driver.write_text(f"import sys\nsys.path.insert(0, {str(dags)!r})\nfrom airflow_tf.cli import main\n"
                      "sys.exit(main(sys.argv[1:]))\n")
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cli = subprocess.run(
        [sys.executable, str(driver), "run", "--dataset", linear_dataset, "--model", "seed_dag_model:seed_model",
         "--ps", "1", "--workers", "1", "--steps", "400", "--learning-rate", "0.1", "--run-dir", str(run_dir),
         "--name", "own-model"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert cli.returncode == 0, cli.stderr
    summary = json.loads(cli.stdout)
    assert summary["succeeded"] and summary["global_step"] >= 400 and math.isfinite(summary["loss"])
    (snapshot,) = (run_dir / CODE_DIR).iterdir()
    manifest = json.loads((snapshot / "model-code.json").read_text())
    assert manifest["source"] == str(dags / "seed_dag_model.py")
    assert f"copied to {snapshot} (sha256 {manifest['sha256']})" in cli.stderr
    worker_log = next(Path(summary["logs"]).glob("*worker-0.log")).read_text()
    assert f"airflow-tf model code seed_dag_model from {snapshot} sha256={manifest['sha256']}" in worker_log
    # One feature: the model is fed it as it is (whole rows are for two or more float features).
    assert " input=by_feature " in worker_log, worker_log[-2000:]
    assert not group_processes(local_state_dir)

    # Evaluation and export (in this process, which does not have the DAGs folder on sys.path
    # either) import the model from the snapshot and record the code's hash.
    from airflow_tf.serving.evaluate import evaluate_checkpoint
    from airflow_tf.serving.export import export_saved_model
    from airflow_tf.serving.versions import METADATA_FILE

    config = TrainingConfig(dataset=linear_dataset, run_dir=str(run_dir), steps=400,
                            model="seed_dag_model:seed_model", code_dir=str(snapshot))
    try:
        result = evaluate_checkpoint(run_dir, linear_dataset, config, plot=False)
        export = export_saved_model(run_dir, linear_dataset, config, tmp_path / "models", "seed")
    finally:
        sys.modules.pop("seed_dag_model", None)
        sys.path[:] = [p for p in sys.path if p != str(snapshot)]
    assert result["metrics"]["mse"] < 0.5, result["metrics"]
    recorded = json.loads((run_dir / "metrics.json").read_text())["model_code"]
    assert recorded["sha256"] == manifest["sha256"] and recorded["model"] == "seed_dag_model:seed_model"
    metadata = json.loads((Path(export["path"]) / METADATA_FILE).read_text())
    assert metadata["model_code"]["sha256"] == manifest["sha256"]
    assert metadata["signature"]["inputs"] == ["x"], "the export serves the feature, whatever the model's input"


@pytest.mark.slow
def test_a_model_whose_output_does_not_fit_the_label_is_refused_before_any_step(linear_dataset, train, tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "wide_model.py").write_text(MODELS)
    run_dir = tmp_path / "run"
    code = snapshot_model_code("wide_model:five_outputs", str(run_dir), [str(dags)])
    run = train("own-wide", linear_dataset, run_dir, workers=1, steps=50, model="wide_model:five_outputs",
                code_dir=code.path)
    assert not run.succeeded
    reason = "model 'wide_model:five_outputs' outputs (None, 5) but label 'y' is a scalar float32"
    assert reason in run.report, run.report
    assert reason in run.lines("worker-0", "status=refused")[0]
    assert not run.lines("worker-0", "session ready"), "no step ran"
    assert models.latest_checkpoint(run_dir) is None
