"""Evaluation and export of a classifier: accuracy and cross-entropy, and a serving signature
that answers with classes and probabilities besides the raw predictions."""

import numpy as np
import pytest
from serving_check import export_and_serve_elsewhere

from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.serving import evaluate_checkpoint, export_saved_model, served_baseline

pytestmark = pytest.mark.slow

CENTRES = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 3.0]])


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
    """A 3-class MLP trained briefly on well separated blobs: (run_dir, dataset, config)."""
    from airflow_tf.backends.local import LocalBackend
    from airflow_tf.backends.wait import run_group
    from airflow_tf.data import prepare_dataset

    root = tmp_path_factory.mktemp("serving-classifier")
    rng = np.random.default_rng(7)
    label = rng.integers(0, len(CENTRES), size=1500)
    points = CENTRES[label] + rng.normal(scale=0.5, size=(len(label), 2))
    csv = root / "blobs.csv"
    with open(csv, "w") as f:
        f.write("a,b,label\n")
        for (a, b), y in zip(points, label):
            f.write(f"{a:.5f},{b:.5f},{y}\n")
    dataset = prepare_dataset(csv, root / "datasets", name="blobs", label="label", shards=2)["dataset_uri"]

    config = TrainingConfig(dataset=dataset, run_dir=str(root / "run"), model="mlp_classifier",
                            model_kwargs={"num_classes": 3, "hidden_units": [16]}, optimizer="adam",
                            learning_rate=0.02, batch_size=64, steps=200)
    backend = LocalBackend(root / "groups")
    result = run_group(backend, GroupSpec.for_training("serving-blobs", config, ps=1, workers=1))
    assert result.outcome.succeeded, result.report
    return root / "run", dataset, config


def test_classifier_metrics_thresholds_and_signature(classifier_run, tmp_path):
    import tensorflow as tf

    run_dir, dataset, config = classifier_run
    # Two float features, a built-in model, the share in memory: the worker was fed whole rows.
    (worker_log,) = (run_dir / "logs").rglob("*worker-0.log")
    assert " input=whole_rows " in worker_log.read_text(), worker_log.read_text()[-2000:]
    result = evaluate_checkpoint(run_dir, dataset, config, thresholds={"accuracy": {"min": 0.9}})
    assert result["task"] == "classification"
    assert set(result["metrics"]) == {"loss", "accuracy", "cross_entropy"}
    assert result["metrics"]["accuracy"] >= 0.9 and result["blessed"]
    assert result["metrics"]["loss"] == pytest.approx(result["metrics"]["cross_entropy"], rel=1e-4)

    exported = export_saved_model(run_dir, dataset, config, tmp_path / "models", "blobs", metrics=result)
    signature = tf.saved_model.load(exported["path"]).signatures["serving_default"]
    assert sorted(spec.name for spec in signature.structured_input_signature[1].values()) == ["a", "b"]

    outputs = signature(a=tf.constant(CENTRES[:, 0], tf.float32), b=tf.constant(CENTRES[:, 1], tf.float32))
    assert set(outputs) == {"predictions", "classes", "probabilities"}
    assert outputs["classes"].dtype == tf.int64
    assert outputs["classes"].numpy().tolist() == [0, 1, 2], "each blob's centre is its own class"
    np.testing.assert_allclose(outputs["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)
    export_and_serve_elsewhere(run_dir, dataset, config, tmp_path / "served")

    baseline = served_baseline(tmp_path / "models", "blobs", dataset, config)
    assert (baseline["metric"], baseline["direction"]) == ("accuracy", "higher")
    assert baseline["metrics"]["accuracy"] == pytest.approx(result["metrics"]["accuracy"])
    better = {**baseline, "metrics": {**baseline["metrics"], "accuracy": result["metrics"]["accuracy"] + 0.01}}
    refused = evaluate_checkpoint(run_dir, dataset, config, baseline=better, plot=False)
    assert not refused["blessed"] and "(higher is better)" in refused["reasons"][0]
