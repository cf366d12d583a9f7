"""What every task of a group is asked to do: the training options.

One definition serves both sides: the launcher turns a :class:`TrainingConfig` into
``python -m airflow_tf.runtime`` arguments (:meth:`TrainingConfig.to_args`), and the runtime
parses them back with :func:`argument_parser` (:meth:`TrainingConfig.from_args`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

OPTIMIZERS = ("sgd", "adam", "adagrad", "rmsprop")
BUILTIN_MODELS = ("linear_regression", "mlp_classifier")


@dataclass
class TrainingConfig:
    dataset: str
    """Dataset directory written by PrepareTFRecords (holds schema.json and _SUCCESS)."""
    run_dir: str
    """Checkpoints, event files and progress.json of this run (shared by all tasks)."""
    model: str = "linear_regression"
    """A built-in model name or ``package.module:function`` returning a Keras model."""
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    loss: str | None = None
    """Keras loss name; None lets the model decide (mse for regression, sparse CE for classes)."""
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    batch_size: int = 64
    steps: int | None = None
    """Target global step. Exactly one of steps / epochs is set (steps wins when both)."""
    epochs: float | None = None
    sync: bool = False
    replicas_to_aggregate: int | None = None
    """Sync mode: gradients aggregated per step; below the worker count, slow workers don't stall."""
    checkpoint_every_secs: float = 10.0
    log_every_secs: float = 2.0
    intra_op_threads: int = 1
    inter_op_threads: int = 2
    seed: int = 0
    warm_start_from: str | None = None
    """A run directory or checkpoint prefix to initialise the model weights from (first start only;
    an export keeps one in its metadata's ``warm_start_from``)."""

    def __post_init__(self) -> None:
        errors = self._coerce_types()
        if errors:
            raise ValueError("invalid training options:\n  " + "\n  ".join(errors))
        if not self.dataset:
            errors.append("dataset: a dataset directory is required")
        if not self.run_dir:
            errors.append("run_dir: a run directory is required")
        if self.steps is None and self.epochs is None:
            errors.append("steps/epochs: set a target global step (steps) or a number of epochs")
        if self.steps is not None and int(self.steps) <= 0:
            errors.append(f"steps: must be positive, got {self.steps}")
        if self.epochs is not None and float(self.epochs) <= 0:
            errors.append(f"epochs: must be positive, got {self.epochs}")
        if int(self.batch_size) <= 0:
            errors.append(f"batch_size: must be positive, got {self.batch_size}")
        if float(self.learning_rate) <= 0:
            errors.append(f"learning_rate: must be positive, got {self.learning_rate}")
        if self.optimizer not in OPTIMIZERS:
            errors.append(f"optimizer: {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.model not in BUILTIN_MODELS and ":" not in self.model:
            errors.append(
                f"model: {self.model!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) "
                "nor an import path 'package.module:function'"
            )
        if self.replicas_to_aggregate is not None and int(self.replicas_to_aggregate) <= 0:
            errors.append(f"replicas_to_aggregate: must be positive, got {self.replicas_to_aggregate}")
        if errors:
            raise ValueError("invalid training options:\n  " + "\n  ".join(errors))

    def _coerce_types(self) -> list[str]:
        """Templated Airflow arguments arrive as strings ("3000"): convert them by field type."""
        errors = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or value == "":
                continue
            kind = str(f.type)
            try:
                if kind.startswith("int"):
                    setattr(self, f.name, int(value))
                elif kind.startswith("float"):
                    setattr(self, f.name, float(value))
                elif kind == "bool":
                    setattr(self, f.name, value.strip().lower() in ("1", "true", "yes", "on"))
                elif kind.startswith("dict"):
                    setattr(self, f.name, json.loads(value))
            except ValueError:
                errors.append(f"{f.name}: {value!r} is not a valid {kind.split(' ')[0]}")
        return errors

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainingConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown training option(s): {', '.join(unknown)}")
        return cls(**data)

    def to_args(self) -> list[str]:
        """Command-line arguments for ``python -m airflow_tf.runtime``."""
        args: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if value is None or (f.name == "model_kwargs" and not value):
                continue
            if isinstance(value, bool):
                if value:
                    args.append(flag)
            elif isinstance(value, dict):
                args += [flag, json.dumps(value, sort_keys=True)]
            else:
                args += [flag, str(value)]
        return args

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> "TrainingConfig":
        return cls.from_namespace(argument_parser().parse_args(argv))

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, **overrides: Any) -> "TrainingConfig":
        """The training options among parsed arguments (other arguments are ignored)."""
        values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)}
        return cls(**{**values, **overrides})


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_tf.runtime",
        description="Run one task (ps, worker, chief or evaluator) of a TensorFlow training group. "
        "The task's role and the cluster come from the TF_CONFIG environment variable.",
    )
    add_training_arguments(parser)
    return parser


def add_training_arguments(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """Every training option as a command-line flag: the runtime's, ``airflow-tf run``'s and
    ``airflow-tf render``'s. ``defaults`` overrides a default (and makes dataset or run_dir,
    otherwise required, optional)."""
    add = parser.add_argument
    add("--dataset", required="dataset" not in defaults,
        help="dataset directory written by PrepareTFRecords / airflow-tf prepare (must hold _SUCCESS)")
    add("--run-dir", dest="run_dir", required="run_dir" not in defaults,
        help="directory for checkpoints, event files and progress.json, shared by all tasks")
    add("--model", default="linear_regression",
        help=f"built-in model ({', '.join(BUILTIN_MODELS)}) or package.module:function")
    add("--model-kwargs", dest="model_kwargs", type=json.loads, default={}, metavar="JSON",
        help="keyword arguments of the model function, as a JSON object")
    add("--loss", default=None, help="Keras loss name (default: chosen from the label)")
    add("--optimizer", default="sgd", choices=OPTIMIZERS)
    add("--learning-rate", dest="learning_rate", type=float, default=0.01)
    add("--batch-size", dest="batch_size", type=int, default=64, help="examples per trainer per step")
    add("--steps", type=int, default=None, help="target global step")
    add("--epochs", type=float, default=None, help="passes over the training split (instead of --steps)")
    add("--sync", action="store_true", help="synchronous updates (SyncReplicasOptimizer)")
    add("--replicas-to-aggregate", dest="replicas_to_aggregate", type=int, default=None,
        help="sync mode: gradients per step (below the worker count, a slow worker stalls no one)")
    add("--checkpoint-every-secs", dest="checkpoint_every_secs", type=float, default=10.0)
    add("--log-every-secs", dest="log_every_secs", type=float, default=2.0)
    add("--intra-op-threads", dest="intra_op_threads", type=int, default=1, help="threads per op in each task")
    add("--inter-op-threads", dest="inter_op_threads", type=int, default=2, help="ops run at once in each task")
    add("--seed", type=int, default=0)
    add("--warm-start-from", dest="warm_start_from", default=None,
        help="run directory or checkpoint prefix to initialise the model weights from (first start only)")
    parser.set_defaults(**defaults)


def dataset_uri_of(value: Any) -> str:
    """The dataset directory from a path, a ``file://`` URI, or the prepare task's XCom."""
    if isinstance(value, dict):
        for key in ("dataset_uri", "uri", "dataset"):
            if isinstance(value.get(key), str):
                value = value[key]
                break
        else:
            raise ValueError(f"dataset: no dataset URI in {sorted(value)}; pass the prepare task's output")
    if not isinstance(value, str) or not value:
        raise ValueError(f"dataset: expected a dataset directory or URI, got {value!r}")
    return value[len("file://"):] if value.startswith("file://") else value
