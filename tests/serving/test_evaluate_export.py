"""Evaluation and SavedModel export of a real training run of the seed's y = 2x + 10.

One short run (1 ps + 1 worker through the local backend) is trained per module; each test
works on its own copy of the run directory and its own serving base."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.serving import (
    ExportError,
    NotBlessedError,
    evaluate_checkpoint,
    export_saved_model,
    latest_export,
    list_versions,
    model_dir,
    served_baseline,
)

pytestmark = pytest.mark.slow

STEPS = 400
GOOD_ENOUGH = {"mse": {"max": 1.0}}
IMPOSSIBLE = {"mse": {"max": 1e-9}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, linear_dataset):
    """(run_dir, config) of a finished training run."""
    from airflow_tf.backends.local import LocalBackend
    from airflow_tf.backends.wait import run_group

    root = tmp_path_factory.mktemp("serving-run")
    config = TrainingConfig(dataset=linear_dataset, run_dir=str(root / "run"), model="linear_regression",
                            learning_rate=0.05, batch_size=32, steps=STEPS, log_every_secs=0.2)
    backend = LocalBackend(root / "groups")
    result = run_group(backend, GroupSpec.for_training("serving-linear", config, ps=1, workers=1))
    assert result.outcome.succeeded, result.report
    assert not backend.status(result.ref).exists, "the group is gone once training is over"
    return root / "run", config


@pytest.fixture
def run(trained, tmp_path):
    """A private copy of the trained run directory, and its config."""
    source, config = trained
    copy = tmp_path / "run"
    shutil.copytree(source, copy)
    # the checkpoint state file may hold absolute paths into the original run directory
    state = copy / "checkpoint"
    state.write_text(state.read_text().replace(str(source), str(copy)))
    return copy, TrainingConfig.from_dict({**config.to_dict(), "run_dir": str(copy)})


def _visible(serving_base, name="linear"):
    """What TF Serving would see, and anything else left in the model directory."""
    directory = model_dir(serving_base, name)
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_evaluation_writes_metrics_and_a_training_curve(run, linear_dataset):
    from airflow_tf.data import count_examples

    run_dir, config = run
    result = evaluate_checkpoint(run_dir, linear_dataset, config, thresholds=GOOD_ENOUGH)

    assert result["task"] == "regression" and result["blessed"] is True
    assert result["reasons"] == [f"mse {result['metrics']['mse']:.6g} <= max 1"]
    assert set(result["metrics"]) == {"loss", "mse", "mae"}
    assert result["metrics"]["mse"] < 1.0, "the sample data has noise of sd 0.33: a fitted line is far below 1"
    assert result["metrics"]["loss"] == pytest.approx(result["metrics"]["mse"], rel=1e-5)
    assert result["global_step"] >= STEPS
    assert result["examples"] == count_examples(linear_dataset, "eval")
    assert json.loads((run_dir / "metrics.json").read_text()) == result

    png = run_dir / "training_curve.png"
    assert result["plot"] == str(png)
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(png).shape
    assert width > 400 and height > 200


def test_an_impossible_threshold_is_not_blessed_and_says_why(run, linear_dataset):
    run_dir, config = run
    result = evaluate_checkpoint(run_dir, linear_dataset, config, thresholds=IMPOSSIBLE)
    assert result["blessed"] is False
    assert result["reasons"][0].startswith("mse ") and "> max 1e-09" in result["reasons"][0]
    # Then what the run itself showed: its last training loss, from the chief's progress report.
    final = json.loads((run_dir / "progress.json").read_text())
    assert f"training: the last reported training loss was {final['loss']:.4g} at global step " \
           f"{final['global_step']}" in result["reasons"]
    assert json.loads((run_dir / "metrics.json").read_text())["blessed"] is False


def test_an_unblessed_model_is_not_exported_and_nothing_is_written(run, linear_dataset, tmp_path):
    run_dir, config = run
    metrics = evaluate_checkpoint(run_dir, linear_dataset, config, thresholds=IMPOSSIBLE, plot=False)
    serving_base = tmp_path / "models"
    with pytest.raises(NotBlessedError) as info:
        export_saved_model(run_dir, linear_dataset, config, serving_base, "linear", metrics=metrics)
    assert "is not blessed: mse" in str(info.value) and "force=True" in str(info.value)
    assert not serving_base.exists()

    # without metrics, the run's metrics.json decides
    with pytest.raises(NotBlessedError, match="not blessed"):
        export_saved_model(run_dir, linear_dataset, config, serving_base, "linear")
    # ... and says so at once: a fresh process refuses without loading TensorFlow, called
    # directly or through the request the command line, the operators and the pods send.
    refused = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from airflow_tf.serving import NotBlessedError, export_saved_model, requests
        for export in (lambda: export_saved_model({str(run_dir)!r}, {linear_dataset!r}, {config.to_dict()!r},
                                                  {str(serving_base)!r}, "linear"),
                       lambda: requests.export({{"run_dir": {str(run_dir)!r}, "dataset": {linear_dataset!r},
                                                "training": {config.to_dict()!r}, "model_name": "linear",
                                                "serving_base": {str(serving_base)!r}}})):
            try:
                export()
            except NotBlessedError:
                print("tensorflow" in sys.modules)
        """)], capture_output=True, text=True, timeout=120)
    assert refused.stdout.split() == ["False", "False"], refused.stderr[-2000:]
    (run_dir / "metrics.json").unlink()
    with pytest.raises(NotBlessedError, match="was not evaluated"):
        export_saved_model(run_dir, linear_dataset, config, serving_base, "linear")
    assert not serving_base.exists()


def test_forced_export_then_a_blessed_one_gets_the_next_version(run, linear_dataset, tmp_path):
    run_dir, config = run
    serving_base = tmp_path / "models"
    unblessed = evaluate_checkpoint(run_dir, linear_dataset, config, thresholds=IMPOSSIBLE, plot=False)
    first = export_saved_model(run_dir, linear_dataset, config, serving_base, "linear", metrics=unblessed, force=True)
    assert (first["version"], first["forced"]) == (1, True)

    blessed = evaluate_checkpoint(run_dir, linear_dataset, config, thresholds=GOOD_ENOUGH, plot=False)
    second = export_saved_model(run_dir, linear_dataset, config, serving_base, "linear", metrics=blessed)
    assert (second["version"], second["forced"]) == (2, False)
    assert second["path"] == str(model_dir(serving_base, "linear") / "2")
    assert _visible(serving_base) == ["1", "2"], "no staging directory is left behind"

    served = latest_export(serving_base, "linear")
    assert served["version"] == 2
    metadata = served["metadata"]
    assert metadata["checkpoint"] == blessed["checkpoint"] and metadata["run_dir"] == str(run_dir)
    assert metadata["metrics"] == blessed and metadata["blessed"] is True
    assert metadata["training_config"]["model"] == "linear_regression"
    assert metadata["dataset"] == linear_dataset

    # the copied checkpoint is enough to rebuild the model, even after the run directory is gone
    from airflow_tf.data import load_schema
    from airflow_tf.runtime.models import restore_model

    shutil.rmtree(run_dir)
    model = restore_model(metadata["warm_start_from"], config, load_schema(linear_dataset))
    assert float(model({"x": np.array([1.0], np.float32)})[0, 0]) == pytest.approx(12.0, abs=0.5)


def test_the_exported_model_serves_2x_plus_10_from_the_raw_feature(run, linear_dataset, tmp_path):
    import tensorflow as tf

    run_dir, config = run
    metrics = evaluate_checkpoint(run_dir, linear_dataset, config, thresholds=GOOD_ENOUGH, plot=False)
    exported = export_saved_model(run_dir, linear_dataset, config, tmp_path / "models", "linear", metrics=metrics)

    signature = tf.saved_model.load(exported["path"]).signatures["serving_default"]
    (spec,) = signature.structured_input_signature[1].values()
    assert (spec.name, spec.dtype, spec.shape.as_list()) == ("x", tf.float32, [None])
    outputs = signature(x=tf.constant([0.0, 1.0, 5.0]))
    assert set(outputs) == {"predictions"}
    np.testing.assert_allclose(outputs["predictions"].numpy()[:, 0], [10.0, 12.0, 20.0], atol=0.5)


def test_a_failure_while_writing_leaves_no_visible_version(run, linear_dataset, tmp_path, monkeypatch):
    from airflow_tf.serving import export

    run_dir, config = run
    metrics = evaluate_checkpoint(run_dir, linear_dataset, config, thresholds=GOOD_ENOUGH, plot=False)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "_write_metadata", disk_full)
    with pytest.raises(OSError, match="No space left"):
        export_saved_model(run_dir, linear_dataset, config, tmp_path / "models", "linear", metrics=metrics)
    assert _visible(tmp_path / "models") == []
    assert latest_export(tmp_path / "models", "linear") is None


def test_an_export_that_does_not_verify_is_not_published(run, linear_dataset, tmp_path, monkeypatch):
    from airflow_tf.serving import export

    run_dir, config = run
    metrics = evaluate_checkpoint(run_dir, linear_dataset, config, thresholds=GOOD_ENOUGH, plot=False)
    write = export._write_saved_model

    def write_other_weights(path, model, *args):
        # a SavedModel whose weights are not the checkpoint's: what verification must catch
        model.set_weights([w + 1.0 for w in model.get_weights()])
        write(path, model, *args)

    monkeypatch.setattr(export, "_write_saved_model", write_other_weights)
    with pytest.raises(ExportError, match="verification failed: the exported model's predictions differ"):
        export_saved_model(run_dir, linear_dataset, config, tmp_path / "models", "linear", metrics=metrics)
    assert _visible(tmp_path / "models") == []


def test_an_export_killed_midway_is_invisible_and_the_next_one_is_version_1(run, linear_dataset, tmp_path):
    run_dir, config = run
    serving_base = tmp_path / "models"
    script = textwrap.dedent("""
        import json, os, signal, sys
        from airflow_tf.serving import export

        def die(*args, **kwargs):  # the SavedModel is written; the process dies before the rename
            os.kill(os.getpid(), signal.SIGKILL)

        export._write_metadata = die
        export.export_saved_model(*json.loads(sys.argv[1]), force=True)
    """)
    args = [str(run_dir), linear_dataset, config.to_dict(), str(serving_base), "linear"]
    # A killed process leaves TensorFlow's temporary files (autograph's) where they are: in this test's own.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TMPDIR": str(temporary)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]

    left = _visible(serving_base)
    assert len(left) == 1 and left[0].startswith(".tmp-"), "only a hidden staging directory remains"
    assert (model_dir(serving_base, "linear") / left[0] / "saved_model.pb").exists()
    assert list_versions(model_dir(serving_base, "linear")) == []
    assert latest_export(serving_base, "linear") is None

    exported = export_saved_model(run_dir, linear_dataset, config, serving_base, "linear", force=True)
    assert exported["version"] == 1


def test_the_served_model_is_the_baseline_of_the_next_evaluation(run, linear_dataset, tmp_path):
    run_dir, config = run
    serving_base = tmp_path / "models"
    assert served_baseline(serving_base, "linear", linear_dataset, config) is None

    metrics = evaluate_checkpoint(run_dir, linear_dataset, config, thresholds=GOOD_ENOUGH, plot=False)
    export_saved_model(run_dir, linear_dataset, config, serving_base, "linear", metrics=metrics)
    baseline = served_baseline(serving_base, "linear", linear_dataset, config)
    assert (baseline["version"], baseline["metric"], baseline["direction"]) == (1, "mse", "lower")
    for name, value in metrics["metrics"].items():  # the same model, through its serving signature
        assert baseline["metrics"][name] == pytest.approx(value, rel=1e-4)

    same = evaluate_checkpoint(run_dir, linear_dataset, config, baseline=baseline, plot=False)
    assert same["blessed"] and same["baseline"]["version"] == 1
    better_served = {**baseline, "metrics": {**baseline["metrics"], "mse": metrics["metrics"]["mse"] / 2}}
    worse = evaluate_checkpoint(run_dir, linear_dataset, config, baseline=better_served, plot=False)
    assert not worse["blessed"]
    assert "served model's" in worse["reasons"][0] and "(lower is better)" in worse["reasons"][0]


def test_a_run_without_checkpoint_is_refused_with_the_run_dir_named(linear_dataset, tmp_path):
    empty = tmp_path / "never-trained"
    empty.mkdir()
    config = TrainingConfig(dataset=linear_dataset, run_dir=str(empty), steps=10)
    with pytest.raises(Exception, match=f"{empty}.*no checkpoint"):
        evaluate_checkpoint(empty, linear_dataset, config)
    assert not (empty / "metrics.json").exists()


def _poison_checkpoint(run_dir, key="model/000_kernel"):
    """Rewrite the run's latest checkpoint with NaN in one weight, as a diverged run would have
    saved it before the runtime refused to (older runs, or a checkpoint copied in)."""
    import tensorflow as tf

    from airflow_tf.runtime import models

    prefix = models.latest_checkpoint(run_dir)
    reader = tf.train.load_checkpoint(prefix)
    values = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    values[key] = np.full_like(values[key], np.nan)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        variables = {name: tf.compat.v1.Variable(value, name=name.replace("/", "_")) for name, value in values.items()}
        session.run(tf.compat.v1.global_variables_initializer())
        tf.compat.v1.train.Saver(variables, save_relative_paths=True).save(session, prefix)


def test_non_finite_metrics_are_refused_naming_the_metric_and_never_exported(run, linear_dataset, tmp_path):
    from airflow_tf.serving import EvaluationError

    run_dir, config = run
    _poison_checkpoint(run_dir)
    with pytest.raises(EvaluationError, match=r"eval metric\(s\) loss=nan, mse=nan, mae=nan are not finite"):
        evaluate_checkpoint(run_dir, linear_dataset, config, plot=False)
    recorded = json.loads((run_dir / "metrics.json").read_text())
    assert recorded["blessed"] is False and any("mse is nan" in reason for reason in recorded["reasons"])

    serving_base = tmp_path / "models"
    with pytest.raises(NotBlessedError):
        export_saved_model(run_dir, linear_dataset, config, serving_base, "linear")
    # force overrides blessing, never finiteness: neither the metrics nor the weights let it through
    with pytest.raises(ExportError, match="mse=nan are not finite"):
        export_saved_model(run_dir, linear_dataset, config, serving_base, "linear", force=True)
    with pytest.raises(ExportError, match="weight 'model/000_kernel' of checkpoint .* holds NaN/inf"):
        export_saved_model(run_dir, linear_dataset, config, serving_base, "linear", metrics={}, force=True)
    assert not serving_base.exists()
