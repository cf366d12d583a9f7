"""One-off components of a training group: ``evaluate`` and ``export`` run once against the
group's storage and hand back one JSON result. When a backend runs one as a process of its own
(on Kubernetes, a Job on the training image), this is what the launcher and the image agree on:
the command line and the exit status that means the request was refused."""

from __future__ import annotations

import json
from typing import Any

COMPONENTS = ("evaluate", "export")

RESULT_MARKER = "airflow-tf-result: "
"""Starts the log line that also shows the result (the whole of it, when a termination message
is too small to hold it)."""

REFUSED_EXIT = 2
"""Exit status of a component that refused its request (bad options, no checkpoint, an unblessed
model): a retry would fail again."""


def component_command(component: str, request: dict[str, Any], result_file: str | None = None) -> list[str]:
    """``python -m airflow_tf.serving <component> --request JSON [--result-file PATH]``: the
    component writes its result, a JSON object, to ``result_file``."""
    if component not in COMPONENTS:
        raise ValueError(f"component {component!r} is not one of {', '.join(COMPONENTS)}")
    command = ["python", "-m", "airflow_tf.serving", component, "--request", json.dumps(request, sort_keys=True)]
    return command + (["--result-file", result_file] if result_file else [])
