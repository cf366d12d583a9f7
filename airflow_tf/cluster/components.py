"""One-off components: ``evaluate`` and ``export`` of a training group, and one part of a
partitioned prepare, each run once against shared storage and hand back one JSON result. When
one runs as a process of its own (on Kubernetes, a Job on the training image), this is what the
launcher and the image agree on: the command line and the exit status that means the request
was refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COMPONENTS = ("evaluate", "export")

RESULT_MARKER = "airflow-tf-result: "
"""Starts the log line that also shows the result (the whole of it, when a termination message
is too small to hold it)."""

REFUSED_EXIT = 2
"""Exit status of a component that refused its request (bad options, no checkpoint, an unblessed
model): a retry would fail again."""


def hand_back_result(result: dict[str, Any], result_file: str | None) -> None:
    """What a component does with its result: write it to ``result_file`` (a container's
    termination message) and print it as the log's last line, after :data:`RESULT_MARKER`."""
    text = json.dumps(result, sort_keys=True, separators=(",", ":"))
    if result_file:
        # Written in place: a termination-log file is mounted by the kubelet and cannot be
        # replaced by a rename; nothing reads it before the container has exited.
        Path(result_file).write_text(text, encoding="utf-8")
    print(RESULT_MARKER + text, flush=True)


def component_command(component: str, request: dict[str, Any], result_file: str | None = None) -> list[str]:
    """``python -m airflow_tf.serving <component> --request JSON [--result-file PATH]``: the
    component writes its result, a JSON object, to ``result_file``."""
    if component not in COMPONENTS:
        raise ValueError(f"component {component!r} is not one of {', '.join(COMPONENTS)}")
    command = ["python", "-m", "airflow_tf.serving", component, "--request", json.dumps(request, sort_keys=True)]
    return command + (["--result-file", result_file] if result_file else [])


PART_COMPONENT = "prepare-part"
"""The container name of a prepare part's pod."""


def part_command(plan: str, index: int, result_file: str | None = None, *, encode_threads: int | None = None,
                 progress_every: float = 5.0) -> list[str]:
    """``python -m airflow_tf.data part --plan DIR --index N [...]``: writes part ``index`` of the
    partitioned prepare planned in ``plan`` (a directory on the storage the part's process
    mounts) and its result, a JSON object, to ``result_file``."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"part index must be a whole number >= 0, got {index!r}")
    if not isinstance(plan, str) or not plan.startswith("/"):
        raise ValueError(f"plan must be an absolute path on the shared volume, got {plan!r}")
    command = ["python", "-m", "airflow_tf.data", "part", "--plan", plan, "--index", str(index),
               "--progress-every", f"{float(progress_every):g}"]
    if encode_threads is not None:
        command += ["--encode-threads", str(int(encode_threads))]
    return command + (["--result-file", result_file] if result_file else [])
