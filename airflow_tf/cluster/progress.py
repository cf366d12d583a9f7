"""Training progress as one log line, written by the chief and read back by any backend
(from a log file, a pod log, or ``progress.json`` in the run directory)."""

from __future__ import annotations

import math
import re
from typing import Any

from airflow_tf.files import plain_absolute_path, read_json_beneath

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


_REPORT_NUMBERS = {"global_step": int, "target_step": int, "percent": float, "examples_per_sec": float,
                   "loss": float, "eta_seconds": float, "time": float}


def read_progress_file(run_dir: str) -> dict[str, Any] | None:
    """The chief's latest report in ``run_dir`` (a local path): global_step, target_step, percent,
    examples_per_sec, loss, eta_seconds, done, time (seconds since the epoch) as written, or None
    when there is none yet or it cannot be read or trusted (see :func:`check_progress_file`)."""
    try:
        return check_progress_file(run_dir)
    except ValueError:
        return None


def check_progress_file(run_dir: str) -> dict[str, Any] | None:
    """:func:`read_progress_file`, raising a ValueError that says why a file there is not read:
    ``run_dir`` not a plain absolute path, the report a symbolic link (or reached through one),
    hard-linked, not JSON, or not a report (``global_step`` missing; a number of the wrong type,
    NaN or infinite). None when there is no report yet."""
    where = f"{plain_absolute_path(run_dir)}/{PROGRESS_FILE}"
    try:
        report = read_json_beneath("/", where)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"{where}: cannot be read ({exc})") from None
    if not isinstance(report, dict) or "global_step" not in report:
        raise ValueError(f"{where}: not a progress report (a JSON object with global_step)")
    for key, kind in _REPORT_NUMBERS.items():
        value: Any = report.get(key)
        if value is None and key != "global_step":
            continue
        ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
        if not ok or not math.isfinite(value):
            raise ValueError(f"{where}: {key} must be a{'n integer' if kind is int else ' finite number'}, "
                             f"got {value!r:.100}")
    if not isinstance(report.get("done", False), bool):
        raise ValueError(f"{where}: done must be true or false, got {report['done']!r:.100}")
    return report
