"""Warm-up requests in TensorFlow Serving's format (``assets.extra/tf_serving_warmup_requests``).

A model server that finds this file replays its records before it reports the version as
available, so the first live requests do not pay for graph optimisation and memory set-up.
Each record is a ``PredictionLog`` holding a ``PredictRequest`` on the ``serving_default``
signature, made of real eval-split rows. The export also uses these requests to check that
the staged version answers through the model server's loading path (:mod:`.loading`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
WARMUP_RECORDS = 4
"""Records in the file: each a batch of distinct eval rows (TF Serving replays each once by default)."""


def predict_requests(features: Mapping[str, Any], model_name: str, signature: str,
                     records: int = WARMUP_RECORDS) -> list[Any]:
    """``PredictRequest`` protos that split the rows of ``features`` (a batch, feature -> array)
    into at most ``records`` consecutive batches, in order, every row in exactly one."""
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    arrays = {name: np.asarray(value) for name, value in features.items()}
    rows = len(next(iter(arrays.values())))
    bounds = np.linspace(0, rows, num=min(records, rows) + 1, dtype=int)
    requests = []
    for start, stop in itertools.pairwise(bounds):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature
        for name, array in arrays.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(array[start:stop]))
        requests.append(request)
    return requests


def write_requests(path: Path, requests: list[Any]) -> None:
    """The requests as TensorFlow Serving reads warm-up records: a TFRecord file of ``PredictionLog``."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for request in requests:
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def read_requests(path: Path) -> Iterator[Any]:
    """The ``PredictRequest`` of each ``PredictionLog`` record of a warm-up file."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    for number, record in enumerate(tf.data.TFRecordDataset(str(path)).as_numpy_iterator(), 1):
        log = prediction_log_pb2.PredictionLog.FromString(record)
        if log.WhichOneof("log_type") != "predict_log":
            raise ValueError(f"{path}: record {number} is a {log.WhichOneof('log_type')}, not a predict_log")
        yield log.predict_log.request
