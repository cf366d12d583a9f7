"""``python -m airflow_tf.serving evaluate|export --request JSON [--result-file PATH]``:
evaluation and export inside the training image, for an Airflow that has no TensorFlow.

With ``backend="kubernetes"`` the EvaluateModelOperator and ExportSavedModelOperator run
this as a one-off Job on the group's training image, with its volumes: it reads the run's
checkpoints and the dataset from shared storage and writes there (``<run_dir>/metrics.json``,
``<serving_base>/<model_name>/<version>/``), as the functions it calls always do. Its result,
a JSON object, goes to ``--result-file``: on Kubernetes the container's termination message
(``/dev/termination-log``), which the backend reads from the pod's status, so the Airflow
workers need not mount the training storage. The log's last line shows it too.

The request (a JSON object, or ``@path`` of a file holding one) is described in
:mod:`airflow_tf.serving.requests`.

Exit status 0 with the result; 2 (:data:`~airflow_tf.cluster.components.REFUSED_EXIT`) when
the request or the model is refused (a retry would fail again), with the reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from airflow_tf.cluster.components import REFUSED_EXIT, hand_back_result

from .requests import COMMANDS, check_request


def _request(text: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except OSError as e:
        raise ValueError(f"--request: cannot read {text[1:]}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--request: not JSON ({e})") from None
    try:
        return check_request(data)
    except ValueError as e:
        raise ValueError(f"--request: {e}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_tf.serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=sorted(COMMANDS))
    parser.add_argument("--request", required=True, help="the request: a JSON object, or @FILE")
    parser.add_argument("--result-file", dest="result_file",
                        help="write the result (a JSON object) here, e.g. the container's termination message")
    args = parser.parse_args(argv)
    from airflow_tf import serving

    refused = (ValueError, serving.EvaluationError, serving.ExportError, serving.NotBlessedError,
               serving.BlessingConfigError)
    try:
        result = COMMANDS[args.command](_request(args.request))
    except refused as e:
        print(f"{args.command} refused: {e}", file=sys.stderr, flush=True)
        return REFUSED_EXIT
    hand_back_result(result, args.result_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
