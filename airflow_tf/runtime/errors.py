"""Errors of a training task, and the one-line reason a failed task reports. Kept free of
TensorFlow so that every role (a ps task too) can use them without importing Keras."""

from __future__ import annotations

import re

REASON_LIMIT = 500
"""Characters of a failure reason kept on the task's last log line."""


class ModelError(ValueError):
    """The model reference, its keyword arguments or a checkpoint do not fit; the message says
    which option or file is wrong and what to do."""


class TaskConfigError(ValueError):
    """TF_CONFIG is missing or malformed, or the options do not fit the cluster."""


class NonFiniteError(RuntimeError):
    """The loss or the variables became NaN/inf (``loss became NaN at global step N``)."""


_NODE = re.compile(r"^Node: '(?P<node>[^']+)'$")
_NOISE = re.compile(r"^(Graph execution error:|Detected at node .* defined at|File \"|\[\[|=+$|$)")
_LOG_LINE = re.compile(r"^[IWEF]\d{4} ")
"""A line of TensorFlow's C++ log, quoted under "Recent warning and error logs:"."""
_DEBUG_DUMP = re.compile(r"\s*goo\.gle/debug\w*\s.*$")
"""The request proto TensorFlow appends to some messages."""


def failure_reason(exc: BaseException) -> str:
    """The cause of ``exc`` in one line: for a TensorFlow error its message without the graph's
    stack frames (``InvalidArgumentError: Incompatible shapes: [64] vs. [64,5] (node sub)``),
    which is what a user needs in the sensor's failure message."""
    text = getattr(exc, "message", None)
    if not isinstance(text, str):
        text = str(exc)
    text = text.split("\n\nOriginal stack trace for", 1)[0]
    node, cause = None, []
    for line in (line.strip() for line in text.splitlines()):
        match = _NODE.match(line)
        if match:
            node = match.group("node")
        elif not (_NOISE.match(line) or _LOG_LINE.match(line) or line == "Recent warning and error logs:"):
            cause.append(_DEBUG_DUMP.sub("", line))
    reason = " ".join(" ".join(cause).split()) or type(exc).__name__
    if not isinstance(exc, (ModelError, TaskConfigError, NonFiniteError)):
        reason = f"{type(exc).__name__}: {reason}"
    if node:
        reason += f" (node {node})"
    return reason if len(reason) <= REASON_LIMIT else reason[:REASON_LIMIT - 3] + "..."
