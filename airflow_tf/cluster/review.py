"""What a person approving an export is shown: the evaluated model's metrics, the thresholds
and the comparison with the served model it would replace, and, in a sweep, the other runs.
Pure text (Markdown, as Airflow's human-in-the-loop page renders it) from the evaluation results."""

from __future__ import annotations

import math
import os
from typing import Any
from collections.abc import Iterable

from .results import EvaluationResult


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def _rule(check: dict[str, Any]) -> str:
    rule = check.get("rule")
    if rule in ("min", "max"):
        return f"{rule} {_number(check.get('limit'))}"
    if rule == "baseline":
        better = "lower" if check.get("direction", "").startswith("lower") else "higher"
        return f"served model {_number(check.get('limit'))} ({better} is better)"
    return str(rule)


def review_subject(model_name: str, evaluation: EvaluationResult) -> str:
    return f"Export {model_name}? Run {os.path.basename(evaluation.run_dir.rstrip('/'))}, " \
           f"step {evaluation.global_step if evaluation.global_step is not None else '?'}"


def review_body(model_name: str, evaluation: EvaluationResult,
                candidates: Iterable[EvaluationResult] = ()) -> str:
    """Markdown: the model, its checks (metric, value, rule, passed), all its metrics, the served
    model's metrics, and the runs of a sweep it was chosen from."""
    e = evaluation
    lines = [
        f"**Approve** publishes this model as the next version of `{model_name}`; **Reject** ends the run "
        "without a new version.",
        "",
        f"- run directory: `{e.run_dir}`",
        f"- checkpoint: `{e.checkpoint}` (global step {_number(e.global_step)})",
        f"- evaluated on {e.examples} examples of the `{e.split}` split of `{e.dataset}`",
        f"- blessed by the rules below: **{'yes' if e.blessed else 'no'}**",
        "",
        "| metric | value | rule | passed |",
        "|---|---|---|---|",
    ]
    for check in e.checks:
        lines.append(f"| {check.get('metric', '-')} | {_number(check.get('value'))} | {_rule(check)} | "
                     f"{'yes' if check.get('passed') else '**no**'} |")
    lines += ["", "All metrics: " + ", ".join(f"{k} {_number(v)}" for k, v in sorted(e.metrics.items()))]
    baseline = e.baseline or {}
    if baseline:
        served = baseline.get("metrics") or {}
        where = f"version {baseline['version']}" if "version" in baseline else "the served model"
        lines += ["", f"Served model ({where}), on the same eval split:",
                  "", "| metric | served | this model |", "|---|---|---|"]
        lines += [f"| {k} | {_number(v)} | {_number(e.metrics.get(k))} |" for k, v in sorted(served.items())]
    else:
        lines += ["", "Served model: none compared (the first version, or `compare_to_served` is off)."]
    others = list(candidates)
    if len(others) > 1:
        lines += ["", f"Chosen from {len(others)} runs of the sweep:", "",
                  "| run | blessed | metrics |", "|---|---|---|"]
        for run in others:
            mark = " (this one)" if os.path.realpath(run.run_dir) == os.path.realpath(e.run_dir) else ""
            lines.append(f"| `{os.path.basename(run.run_dir.rstrip('/'))}`{mark} | {'yes' if run.blessed else 'no'} | "
                         + ", ".join(f"{k} {_number(v)}" for k, v in sorted(run.metrics.items())) + " |")
    return "\n".join(lines)
