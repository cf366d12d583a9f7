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
