"""What a model server on another machine sees of an export: the version moved elsewhere, the
run directory and the dataset gone, loaded in a fresh process as TensorFlow Serving loads it
(a TF1 session running the restore op, then the init op) and through ``tf.saved_model.load``.

Shared by the serving tests of every model kind (quick ones on checkpoints written here, slow
ones on real training runs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

WARMUP = Path("assets.extra") / "tf_serving_warmup_requests"


def move_export(path: str | Path, elsewhere: Path) -> Path:
    """The export directory moved under ``elsewhere`` (as a copy to another machine would be)."""
    target = elsewhere / "serving" / "model" / Path(path).name
    target.parent.mkdir(parents=True)
    shutil.move(str(path), target)
    return target


def serve_both_ways(export_dir: Path, requests_file: Path, scratch: Path) -> np.ndarray:
    """Answer every request of ``requests_file`` both ways in a fresh process; fails the test
    unless both loaders load the export and agree. Returns the predictions, in request order."""
    outputs = scratch / "predictions.npy"
    done = subprocess.run([sys.executable, "-m", "airflow_tf.serving.loading", str(export_dir), str(requests_file),
                           str(outputs)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"the export does not serve both ways: {done.stderr[-3000:]}"
    return np.load(outputs, allow_pickle=False)


def request_rows(requests_file: Path) -> dict[str, np.ndarray]:
    """The inputs of every request of a warm-up file, concatenated in order, by input name."""
    from airflow_tf.serving.loading import request_inputs
    from airflow_tf.serving.warmup import read_requests

    batches = [request_inputs(request) for request in read_requests(requests_file)]
    return {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}


def export_and_serve_elsewhere(run_dir: str | Path, dataset: str, config, tmp_path: Path, probe=None,
                               model_name: str = "model"):
    """Export a private copy of a run (its newest checkpoint) and dataset, remember what the
    checkpoint's model answers on the warm-up rows (and on ``probe``, a batch), move the export
    away, delete the copies, and serve the export both ways in a fresh process; the answers
    must be the checkpoint model's. Returns (export result, moved export, the model's answers
    on ``probe``)."""
    import tensorflow as tf

    from airflow_tf.cluster import TrainingConfig
    from airflow_tf.data import load_schema
    from airflow_tf.runtime import models
    from airflow_tf.serving import export_saved_model
    from airflow_tf.serving.evaluate import training_config

    source = tmp_path / "source"
    run_copy = shutil.copytree(run_dir, source / "run")
    dataset_path = Path(dataset.removeprefix("file://"))
    dataset_copy = shutil.copytree(dataset_path, source / "datasets" / dataset_path.parent.name / dataset_path.name)
    checkpoint = str(run_copy / Path(models.resolve_checkpoint(run_dir)).name)
    config = TrainingConfig.from_dict({**training_config(config).to_dict(),
                                       "run_dir": str(run_copy), "dataset": str(dataset_copy)})
    exported = export_saved_model(run_copy, str(dataset_copy), config, tmp_path / "models", model_name, force=True,
                                  checkpoint=checkpoint)
    model = models.restore_model(checkpoint, config, load_schema(str(dataset_copy)))

    def predict(rows):
        return model({name: tf.constant(value) for name, value in rows.items()}, training=False).numpy()

    expected = predict(request_rows(Path(exported["path"]) / WARMUP))
    moved = move_export(exported["path"], tmp_path / "elsewhere")
    shutil.rmtree(source)
    np.testing.assert_allclose(serve_both_ways(moved, moved / WARMUP, tmp_path), expected, rtol=1e-5, atol=1e-6)
    return exported, moved, None if probe is None else predict(probe)
