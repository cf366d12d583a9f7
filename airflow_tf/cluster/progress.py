"""Training progress as one log line, written by the chief and read back by any backend
(from a log file, a pod log, or ``progress.json`` in the run directory)."""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

PREFIX = "airflow-tf progress"
_FIELDS = ("global_step", "target_step", "percent", "examples_per_sec", "loss", "eta_seconds", "stalls")
_INTEGERS = ("global_step", "target_step", "stalls")
_LINE = re.compile(PREFIX + r"((?:\s+\w+=\S+)+)")


def format_progress(global_step: int, target_step: int, examples_per_sec: float,
                    loss: float | None, eta_seconds: float | None, *, stalls: int = 0) -> str:
    """``stalls``: steps that ran past their bound and were recovered so far (shown when > 0)."""
    percent = 100.0 * min(global_step, target_step) / target_step if target_step else 0.0
    parts = [
        f"global_step={int(global_step)}",
        f"target_step={int(target_step)}",
        f"percent={percent:.1f}",
        f"examples_per_sec={examples_per_sec:.1f}",
        f"loss={'nan' if loss is None else f'{loss:.6g}'}",
        f"eta_seconds={'nan' if eta_seconds is None else f'{eta_seconds:.1f}'}",
    ]
    if stalls:
        parts.append(f"stalls={int(stalls)}")
    return f"{PREFIX} " + " ".join(parts)


def parse_progress(text: str) -> dict[str, Any] | None:
    """The last whole progress line in ``text`` as a dict, or None if there is none. A line
    another writer of the same log cut into (TensorFlow's C++ logging shares the file) is
    skipped for the one before it: a log line never stops the reader."""
    for match in reversed(_LINE.findall(text)):
        try:
            return _fields(match)
        except ValueError:
            continue
    return None


def _fields(pairs: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for pair in pairs.split():
        key, _, value = pair.partition("=")
        if key not in _FIELDS:
            continue
        if key in _INTEGERS:
            result[key] = int(value)
        else:
            number = float(value)
            result[key] = None if math.isnan(number) else number
    if "global_step" not in result or "target_step" not in result:
        raise ValueError("not a whole progress line")
    return result


def describe(progress: dict[str, Any] | None) -> str:
    """``global step 120/1000 (12.0%), 5300 examples/s, ETA 8s`` for task logs."""
    if not progress:
        return "no training progress yet"
    text = f"global step {progress['global_step']}/{progress['target_step']} ({progress['percent']:.1f}%)"
    if progress.get("examples_per_sec"):
        text += f", {progress['examples_per_sec']:.0f} examples/s"
    if progress.get("loss") is not None:
        text += f", loss {progress['loss']:.4g}"
    if progress.get("eta_seconds") is not None:
        text += f", ETA {progress['eta_seconds']:.0f}s"
    if progress.get("stalls"):
        text += f", {progress['stalls']} stuck step(s) recovered (see the chief's log: 'stalled step recovered')"
    return text


PROGRESS_FILE = "progress.json"
"""The chief's latest report in the run directory (rewritten whole at every report)."""


def read_progress_file(run_dir: str) -> dict[str, Any] | None:
    """The chief's latest report in ``run_dir`` (a local path): global_step, target_step, percent,
    examples_per_sec, loss, eta_seconds, done, time (seconds since the epoch) as written, or None
    when there is none yet or it cannot be read (a report being replaced, a run on object storage)."""
    try:
        with open(os.path.join(run_dir, PROGRESS_FILE), encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and "global_step" in report else None
