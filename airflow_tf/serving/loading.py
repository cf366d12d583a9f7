"""An export answered the two ways it is loaded: as TensorFlow Serving loads it, and as
TensorFlow 2 code loads it.

TensorFlow Serving (its C++ ``LoadSavedModel``, like ``saved_model_cli run``) opens a TF1
session on the MetaGraph, runs the saver's restore op on ``variables/``, then the init op
(lookup tables from ``assets/``), and feeds the signature's tensors by name.
``tf.saved_model.load`` instead restores objects into eager variables; an export can pass it
and still fail the model server, so both are checked.

``python -m airflow_tf.serving.loading EXPORT_DIR REQUESTS OUTPUTS`` answers each
``PredictRequest`` of a warm-up file (:mod:`.warmup`) both ways in this fresh process, fails
(exit 1, the reason on stderr) unless the answers agree, and writes the ``predictions`` of
every request, in order, to ``OUTPUTS`` (``.npy``). The export runs it on the staged version
before publishing it."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SERVE_TAG = "serve"
SIGNATURE = "serving_default"


class ServingLoadError(RuntimeError):
    """The export does not load, or does not answer the same, through one of the two paths."""


def request_inputs(request: Any) -> dict[str, Any]:
    """A ``PredictRequest``'s inputs as NumPy arrays by input name."""
    import tensorflow as tf

    return {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}


def session_predict(export_dir: str | Path, batches: Sequence[Mapping[str, Any]],
                    signature: str = SIGNATURE) -> list[dict[str, Any]]:
    """Each batch's outputs from a TF1 session that loaded ``export_dir`` as the model server does."""
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        try:
            meta_graph = tf.compat.v1.saved_model.loader.load(session, [SERVE_TAG], str(export_dir))
        except tf.errors.OpError as exc:
            raise ServingLoadError(_op_failure("loading (restore op, then init op)", exc)) from None
        if signature not in meta_graph.signature_def:
            raise ServingLoadError(f"the MetaGraph has no {signature!r} signature (it has "
                                   f"{', '.join(meta_graph.signature_def) or 'none'})")
        signature_def = meta_graph.signature_def[signature]
        fetches = {name: info.name for name, info in signature_def.outputs.items()}
        answers = []
        for batch in batches:
            missing = set(signature_def.inputs) - set(batch)
            if missing:
                raise ServingLoadError(f"signature {signature!r} needs inputs {sorted(missing)} the request lacks")
            feed = {signature_def.inputs[name].name: value for name, value in batch.items()}
            try:
                answers.append(session.run(fetches, feed_dict=feed))
            except tf.errors.OpError as exc:
                raise ServingLoadError(_op_failure(f"running signature {signature!r}", exc)) from None
    return answers


def eager_predict(export_dir: str | Path, batches: Sequence[Mapping[str, Any]],
                  signature: str = SIGNATURE) -> list[dict[str, Any]]:
    """Each batch's outputs through ``tf.saved_model.load(export_dir).signatures[signature]``."""
    import tensorflow as tf

    function = tf.saved_model.load(str(export_dir)).signatures[signature]
    return [{name: value.numpy() for name, value in function(**{k: tf.constant(v) for k, v in batch.items()}).items()}
            for batch in batches]


def _op_failure(doing: str, exc: Any) -> str:
    # The first line is often only "Graph execution error:"; the reason (which variable, which
    # table) is the next one.
    lines = [line.strip() for line in (exc.message or "").splitlines() if line.strip()]
    reasons = [line for line in lines if not line.endswith("error:")] or lines or [type(exc).__name__]
    first = reasons[0].split(" Debug info:")[0]
    node = f" (op {exc.op.name})" if getattr(exc, "op", None) is not None else ""
    return (f"{doing} failed with {type(exc).__name__}: {first}{node}. A variable the restore op does not "
            "restore, or a table the init op does not initialise, is model state the SavedModel does not "
            "hold: keep every variable a weight of a Keras layer of the model, and every lookup table inside "
            "a layer")


def compare(session: Sequence[Mapping[str, Any]], eager: Sequence[Mapping[str, Any]], rtol: float = 1e-5,
            atol: float = 1e-6) -> None:
    """Raise :class:`ServingLoadError` unless both paths gave the same outputs for every batch."""
    import numpy as np

    for number, (left, right) in enumerate(zip(session, eager, strict=True), 1):
        if set(left) != set(right):
            raise ServingLoadError(f"request {number}: the session gives outputs {sorted(left)}, "
                                   f"tf.saved_model.load {sorted(right)}")
        for name in left:
            a, b = np.asarray(left[name]), np.asarray(right[name])
            same = a.shape == b.shape and (np.array_equal(a, b) if a.dtype.kind in "OSUbiu"
                                           else np.allclose(a, b, rtol=rtol, atol=atol))
            if not same:
                raise ServingLoadError(f"request {number}: output {name!r} differs between the session loader "
                                       f"and tf.saved_model.load (shapes {a.shape} and {b.shape})")


def check(export_dir: str | Path, requests_file: str | Path) -> Any:
    """Answer every request of ``requests_file`` both ways; the predictions, concatenated in order."""
    import numpy as np

    from .warmup import read_requests

    batches = [request_inputs(request) for request in read_requests(Path(requests_file))]
    if not batches:
        raise ServingLoadError(f"{requests_file} holds no request")
    session = session_predict(export_dir, batches)
    try:
        eager = eager_predict(export_dir, batches)
    except Exception as exc:  # any failure to load or call is the reason to report
        raise ServingLoadError(f"tf.saved_model.load failed: {type(exc).__name__}: {exc}") from None
    compare(session, eager)
    return np.concatenate([np.asarray(answer["predictions"]) for answer in session])


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    from airflow_tf.runtime.startup import import_tensorflow

    import_tensorflow(keras=False)  # as in TensorFlow Serving, which has no Keras to lean on
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m airflow_tf.serving.loading EXPORT_DIR REQUESTS OUTPUTS.npy", file=sys.stderr)
        return 2
    export_dir, requests_file, outputs = args
    try:
        predictions = check(export_dir, requests_file)
    except ServingLoadError as exc:
        print(exc, file=sys.stderr)
        return 1
    np.save(outputs, predictions, allow_pickle=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
