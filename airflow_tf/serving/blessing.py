"""Blessing: is an evaluated model good enough to serve?

Two kinds of rule, both optional:

* thresholds, one bound or two per metric: ``{"accuracy": {"min": 0.9}, "mse": {"max": 1.0}}``;
* a baseline, the metrics of the model currently served: the candidate must be at least as good
  on one metric (``mse`` for regression, ``accuracy`` for classification unless chosen), in that
  metric's direction (lower is better for losses and errors, higher for accuracy).

A model whose metrics are not finite numbers is never blessed. Pure Python: no TensorFlow."""

from __future__ import annotations

import json
import math
from typing import Any
from collections.abc import Mapping

LOWER_IS_BETTER = "lower"
HIGHER_IS_BETTER = "higher"

# Every metric evaluation reports, with the direction in which it improves.
METRIC_DIRECTIONS = {
    "loss": LOWER_IS_BETTER,
    "mse": LOWER_IS_BETTER,
    "mae": LOWER_IS_BETTER,
    "cross_entropy": LOWER_IS_BETTER,
    "accuracy": HIGHER_IS_BETTER,
    "auc": HIGHER_IS_BETTER,
}
TASK_METRICS = {
    "regression": ("loss", "mse", "mae"),
    "classification": ("loss", "accuracy", "cross_entropy"),
    "binary_classification": ("loss", "auc", "accuracy", "cross_entropy"),
}
# The metric a candidate is compared on against the served model when the user picks none.
DEFAULT_BASELINE_METRIC = {"regression": "mse", "classification": "accuracy", "binary_classification": "auc"}
_BOUNDS = ("min", "max")


class BlessingConfigError(ValueError):
    """Thresholds or baseline settings that cannot be applied; the message names the metric."""


def validate_thresholds(thresholds: Mapping[str, Any] | str | None,
                        task: str | None = None) -> dict[str, dict[str, float]]:
    """Thresholds as ``{metric: {"min"|"max": float}}``, checked; a JSON string is accepted
    (templated operator arguments arrive as text). With ``task``, the metrics must be ones
    that task reports."""
    if thresholds is None or thresholds == "":
        return {}
    if isinstance(thresholds, str):
        try:
            thresholds = json.loads(thresholds)
        except json.JSONDecodeError as exc:
            raise BlessingConfigError(f"thresholds: not valid JSON ({exc}): {thresholds!r}") from exc
    if not isinstance(thresholds, Mapping):
        raise BlessingConfigError(
            f"thresholds: expected a mapping like {{\"mse\": {{\"max\": 1.0}}}}, got {type(thresholds).__name__}"
        )
    known = TASK_METRICS[task] if task else tuple(METRIC_DIRECTIONS)
    checked: dict[str, dict[str, float]] = {}
    for metric, bounds in thresholds.items():
        if metric not in known:
            what = f"a metric of this {task} model" if task else "a known metric"
            raise BlessingConfigError(
                f"thresholds[{metric!r}]: {metric!r} is not {what}; choose from {', '.join(known)}"
            )
        entry = _checked_bounds(metric, bounds)
        checked[metric] = entry
    return checked


def _checked_bounds(metric: str, bounds: Any) -> dict[str, float]:
    """One metric's ``{"min"|"max": number}``, each a finite number, min not over max."""
    if not isinstance(bounds, Mapping) or not bounds or set(bounds) - set(_BOUNDS):
        raise BlessingConfigError(
            f"thresholds[{metric!r}]: expected {{\"min\": number}} and/or {{\"max\": number}}, got {bounds!r}"
        )
    entry: dict[str, float] = {}
    for bound, value in bounds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise BlessingConfigError(
                f"thresholds[{metric!r}][{bound!r}]: must be a finite number, got {value!r}"
            )
        entry[bound] = float(value)
    if "min" in entry and "max" in entry and entry["min"] > entry["max"]:
        raise BlessingConfigError(
            f"thresholds[{metric!r}]: min {entry['min']} is greater than max {entry['max']}; no model can pass"
        )
    return entry


def baseline_metric_for(task: str, metric: str | None) -> tuple[str, str]:
    """The metric to compare against the served model, and its direction."""
    metric = metric or DEFAULT_BASELINE_METRIC[task]
    if metric not in TASK_METRICS[task]:
        raise BlessingConfigError(
            f"baseline_metric: {metric!r} is not a metric of this {task} model; "
            f"choose from {', '.join(TASK_METRICS[task])}"
        )
    return metric, METRIC_DIRECTIONS[metric]


def baseline_metrics(baseline: Mapping[str, Any] | None) -> dict[str, float] | None:
    """The metric values of a baseline given as an evaluation result (with ``metrics``) or as
    a plain ``{metric: value}`` mapping."""
    if baseline is None:
        return None
    if not isinstance(baseline, Mapping):
        raise BlessingConfigError(f"baseline: expected the served model's metrics as a mapping, got {baseline!r}")
    values = baseline.get("metrics", baseline)
    if not isinstance(values, Mapping):
        raise BlessingConfigError(f"baseline['metrics']: expected a mapping of metric values, got {values!r}")
    return {k: v for k, v in values.items() if k in METRIC_DIRECTIONS}


def decide(metrics: Mapping[str, float], task: str, thresholds: Mapping[str, Any] | str | None = None,
           baseline: Mapping[str, Any] | None = None,
           baseline_metric: str | None = None) -> tuple[bool, list[dict[str, Any]]]:
    """Apply the rules. Returns ``(blessed, checks)``; each check says what was compared and
    whether it passed, in words (``reason``) and in fields."""
    rules = validate_thresholds(thresholds, task)
    checks: list[dict[str, Any]] = []

    for name in TASK_METRICS[task]:
        value = metrics.get(name)
        if value is None or not math.isfinite(value):
            checks.append({"metric": name, "rule": "finite", "value": value, "passed": False,
                           "reason": f"{name} is {value}: the model diverged or the eval split is empty"})

    for name, bounds in rules.items():
        value = float(metrics[name])
        for bound, limit in bounds.items():
            passed = math.isfinite(value) and (value >= limit if bound == "min" else value <= limit)
            sign = (">=" if passed else "<") if bound == "min" else ("<=" if passed else ">")
            checks.append({"metric": name, "rule": bound, "value": value, "limit": limit, "passed": passed,
                           "reason": f"{name} {value:.6g} {sign} {bound} {limit:.6g}"})

    served = baseline_metrics(baseline)
    if served is not None:
        name, direction = baseline_metric_for(task, baseline_metric)
        if name not in served or served[name] is None:
            raise BlessingConfigError(
                f"baseline: the served model's metrics have no {name!r} (they have {', '.join(sorted(served)) or 'none'}); "
                "evaluate both models on the same kind of task or choose another baseline_metric"
            )
        value, reference = float(metrics[name]), float(served[name])
        if not math.isfinite(reference):
            passed = math.isfinite(value)
            reason = f"served model's {name} is {reference}: any finite candidate is better"
        else:
            passed = value <= reference if direction == LOWER_IS_BETTER else value >= reference
            sign = {(True, True): "<=", (True, False): ">", (False, True): ">=", (False, False): "<"}[
                (direction == LOWER_IS_BETTER, passed)]
            reason = f"{name} {value:.6g} {sign} served model's {reference:.6g} ({direction} is better)"
        checks.append({"metric": name, "rule": "baseline", "direction": direction, "value": value,
                       "limit": reference, "passed": passed, "reason": reason})

    if not checks:
        checks.append({"rule": "none", "passed": True,
                       "reason": "no thresholds and no baseline given: any finite model is blessed"})
    return all(c["passed"] for c in checks), checks


def training_context(progress: Mapping[str, Any] | None, checkpoint_step: int | None, sync: bool,
                     replicas_to_aggregate: int | None = None) -> list[str]:
    """Why an unblessed model may be what it is, from the chief's last progress report
    (``progress.json``) and the evaluated checkpoint: the facts that differ from run to run."""
    if not progress:
        return ["training: the run left no progress report (progress.json), so how it ended is unknown"]
    facts = []
    target, final = progress.get("target_step"), progress.get("global_step")
    if checkpoint_step is not None and target and checkpoint_step < target:
        facts.append(f"training: the evaluated checkpoint is at global step {checkpoint_step} of the target {target} "
                     f"(the run {'reported its end' if progress.get('done') else 'never reported its end'} at "
                     f"global step {final}): it stopped early or its last checkpoint is older")
    loss = progress.get("loss")
    if loss is not None:
        facts.append(f"training: the last reported training loss was {loss:.4g} at global step {final}")
    stalls = progress.get("stalls") or []
    if stalls:
        redone = ", ".join(f"after global step {s['global_step']} ({s['cause']})" for s in stalls)
        facts.append(f"training: {len(stalls)} stuck step(s) were cut and the session recreated, redoing the steps "
                     f"since the last checkpoint: {redone}")
    if sync:
        facts.append(f"training: synchronous, {replicas_to_aggregate or 'all'} gradient(s) per global step; gradients "
                     "computed on weights that have moved on are dropped, so a slow or restarted worker's steps are "
                     "lost and the model can differ from run to run: compare with the run's curve "
                     "(training_curve.png) and the other runs' metrics")
    return facts
