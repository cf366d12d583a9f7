"""What the launch, the evaluation and the export hand to the tasks after them (through XCom).

Typed here, pure Python, serialised as plain dicts (``to_dict``) so XCom, templates and the
REST API show them as JSON; ``from_dict`` takes that dict back (and an instance as it is),
naming what is missing. A DAG author reads fields (``result.blessed``), not keys."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .training import TrainingConfig

T = TypeVar("T", bound="_Result")


class _Result:
    """to_dict / from_dict shared by the result types."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)  # type: ignore[call-overload]
        # Unknown keys kept in ``extra`` go back where they came from: the dict round-trips.
        return {**data.pop("extra", {}), **data}

    @classmethod
    def from_dict(cls: type[T], data: Any) -> T:
        if isinstance(data, cls):
            return data
        what = cls.__name__
        if not isinstance(data, dict):
            raise ValueError(f"{what}: expected the upstream task's result (a dict from XCom), got {data!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        required = [name for name, f in fields.items()
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"{what}: missing {', '.join(missing)} in {sorted(data)}; pass the output of the "
                             "task that makes it (e.g. launch.output, evaluate.output)")
        known = {k: v for k, v in data.items() if k in fields}
        hints = typing.get_type_hints(cls)
        for name, value in known.items():
            if not _has_type(value, hints[name]):
                raise ValueError(f"{what}: {name} must be {_type_name(hints[name])}, got {type(value).__name__} "
                                 f"{value!r:.200}; pass the output of the task that makes it")
        extra = {k: v for k, v in data.items() if k not in fields}
        if "extra" in fields and extra:
            known["extra"] = extra
        result = cls(**known)
        result._check()
        return result

    def _check(self) -> None:
        """What a result must hold beyond its fields' types (raises ValueError)."""


def _has_type(value: Any, hint: Any) -> bool:
    """Whether ``value`` (from JSON) is of a field's declared type: the outer type only (``dict``,
    ``list``, ``str``, ...), ``X | None``; a bool is not a number here."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    kind = origin or hint
    if kind in (int, float) and isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(typing.get_origin(hint) or hint, "__name__", str(hint))


@dataclass
class LaunchResult(_Result):
    """The launch task's XCom: how to find the group again and what it trains."""

    group: dict[str, Any]
    """The group reference (backend, name, namespace, reconnect options, success policy)."""
    run_dir: str
    dataset: str
    training: dict[str, Any]
    """The :class:`~airflow_tf.cluster.TrainingConfig` as a dict."""
    reattached: bool = False
    """True when this try found the group an earlier try launched."""
    map_index: int = -1
    """The launch's map index in a mapped (``.expand``) launch, else -1."""
    code_hash: str | None = None
    """Hash of the model-code snapshot in the run directory, when the model's code was snapshotted."""

    @property
    def name(self) -> str:
        return str(self.group["name"])

    def _check(self) -> None:
        if not isinstance(self.group.get("name"), str) or not self.group["name"]:
            raise ValueError(f"LaunchResult: group must name its group (a non-empty string under 'name'), got "
                             f"{self.group!r:.200}; pass the output of the launch task")

    def training_config(self) -> TrainingConfig:
        return TrainingConfig.from_dict(self.training)


@dataclass
class EvaluationResult(_Result):
    """What the evaluation wrote to ``<run_dir>/metrics.json``: metrics and the blessing."""

    run_dir: str
    checkpoint: str
    metrics: dict[str, float]
    blessed: bool
    task: str = "regression"
    global_step: int | None = None
    dataset: str | None = None
    split: str = "eval"
    examples: int = 0
    thresholds: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None
    reasons: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    metrics_file: str | None = None
    plot: str | None = None
    evaluated_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else the evaluation recorded (e.g. the model code's hash)."""

    def metric(self, name: str) -> float:
        if name not in self.metrics:
            raise ValueError(f"metric {name!r} was not computed for {self.run_dir}; it has "
                             f"{', '.join(sorted(self.metrics)) or 'none'}")
        return float(self.metrics[name])


@dataclass
class ExportResult(_Result):
    """A published model version: ``<serving_base>/<model_name>/<version>/``."""

    path: str
    version: int
    model_name: str
    model_dir: str | None = None
    serving_base: str | None = None
    checkpoint: str | None = None
    global_step: int | None = None
    task: str | None = None
    signature: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    """The evaluation behind this version (metric values, blessed and why)."""
    blessed: bool = False
    forced: bool = False
    warm_start_from: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# What a lower metric means better: losses and errors; anything else (accuracy, auc) is higher-better.
_LOWER_IS_BETTER = ("loss", "mse", "mae", "rmse", "error", "crossentropy")


def lower_is_better(metric: str) -> bool:
    return any(word in metric.lower() for word in _LOWER_IS_BETTER)


def best_evaluation(evaluations: list[Any], metric: str) -> int:
    """Index of the best blessed evaluation by ``metric`` (lower is better for losses and
    errors, higher otherwise); ties go to the first. Raises when none is blessed."""
    results = [EvaluationResult.from_dict(e) for e in evaluations]
    blessed = [i for i, r in enumerate(results) if r.blessed]
    if not blessed:
        reasons = "; ".join(f"{r.run_dir}: {', '.join(r.reasons) or 'not blessed'}" for r in results)
        raise ValueError(f"no run of the sweep is blessed, so none is exported ({reasons or 'no evaluations'})")
    sign = 1.0 if lower_is_better(metric) else -1.0
    return min(blessed, key=lambda i: (sign * results[i].metric(metric), i))
