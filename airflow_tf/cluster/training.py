"""What every task of a group is asked to do: the training options.

One definition serves both sides: the launcher turns a :class:`TrainingConfig` into
``python -m airflow_tf.runtime`` arguments (:meth:`TrainingConfig.to_args`), and the runtime
parses them back with :func:`argument_parser` (:meth:`TrainingConfig.from_args`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from airflow_tf.files import strip_file_scheme, training_location_problem

from .memory import memory_bytes

OPTIMIZERS = ("sgd", "adam", "adagrad", "rmsprop", "lazy_adam", "ftrl")
"""``lazy_adam`` is Adam that updates the moments of the embedding rows a step looked up only
(``adam`` decays every row's moments every step); ``ftrl`` is TensorFlow's FTRL-Proximal."""
DEFAULT_MIN_SHARD_BYTES = 16 * 2**20
DEFAULT_MAX_SHARD_BYTES = 128 * 2**20
BUILTIN_MODELS = ("linear_regression", "mlp_classifier")
MODES = ("between_graph", "coordinator")
"""``between_graph``: every worker builds its own graph (TF1-compat replication, async or sync).
``coordinator``: one chief drives the group with ``ParameterServerStrategy`` (async only)."""
ON_NAN = ("fail", "stop")
"""What a loss that becomes NaN/inf does: fail the run, or stop and keep the last finite checkpoint."""


def _option(default: Any = dataclasses.MISSING, doc: str = "") -> Any:
    """A training option: its default and its one-line documentation, which the launch
    operator's parameters and reference take over (``dataclasses.fields(TrainingConfig)``)."""
    return field(default=default, metadata={"doc": doc})


@dataclass
class TrainingConfig:
    """The options of one training run. Each field's default and ``metadata["doc"]`` are the
    only ones: the launch operator's parameters and reference and the command line take them over."""

    dataset: str = _option(doc="dataset directory written by PrepareTFRecords (holds schema.json and _SUCCESS)")
    run_dir: str = _option(doc="checkpoints, event files and progress.json of this run, shared by every task")
    model: str = _option("linear_regression", "a built-in model (``linear_regression``, ``mlp_classifier``) or "
                         "``package.module:function`` returning a Keras model. A module kept next to the DAG file "
                         "is snapshotted into the run directory, so every task imports it from there")
    model_kwargs: dict[str, Any] = field(default_factory=dict, metadata={"doc": "keyword arguments of the model function"})
    loss: str | None = _option(None, "Keras loss name; None lets the model decide (mse for regression, sparse "
                               "categorical cross-entropy for classes)")
    optimizer: str = _option("sgd", "``sgd``, ``adam``, ``adagrad``, ``rmsprop``, ``lazy_adam`` (Adam updating "
                             "only the embedding rows a step looked up) or ``ftrl``")
    learning_rate: float = _option(0.01, "the optimizer's learning rate")
    batch_size: int = _option(64, "examples per worker per step")
    steps: int | None = _option(None, "target global step (set ``steps`` or ``epochs``; ``steps`` wins when both)")
    epochs: float | None = _option(None, "passes over the training split, instead of ``steps``")
    sync: bool = _option(False, "synchronous updates (``SyncReplicasOptimizer``) instead of asynchronous")
    replicas_to_aggregate: int | None = _option(None, "sync mode: gradients aggregated per step (below the worker "
                                                "count, a slow worker stalls no one); None: every worker's")
    checkpoint_every_secs: float = _option(10.0, "seconds between checkpoints")
    log_every_secs: float = _option(2.0, "seconds between progress lines in the task logs")
    intra_op_threads: int = _option(1, "threads per TensorFlow op in each task")
    inter_op_threads: int = _option(2, "TensorFlow ops run at once in each task")
    seed: int = _option(0, "random seed of the model and the input pipeline")
    warm_start_from: str | None = _option(None, "run directory or checkpoint prefix to initialise the weights "
                                          "from (first start only; an export records one in its metadata's "
                                          "``warm_start_from``)")
    mode: str = _option("between_graph", "``between_graph`` (each worker drives itself) or ``coordinator`` (the "
                        "chief drives the group with ``ParameterServerStrategy``; asynchronous only)")
    devices_per_worker: int | None = _option(None, "towers per worker, gradients averaged before the update; "
                                             "None: the worker's GPUs, else 1")
    on_nan: str = _option("fail", "a loss that becomes NaN/inf fails the run (``fail``) or stops it keeping the "
                          "last finite checkpoint (``stop``)")
    operation_timeout_secs: float = _option(300.0, "bound on one session step: a step stuck longer errors and "
                                            "the session recovers")
    summary_every_steps: int = _option(100, "TensorBoard summaries (loss, examples/s, learning rate) every N "
                                       "global steps, besides every ``log_every_secs``")
    code_dir: str | None = _option(None, "snapshot of the model's code (written by the launch into the run "
                                   "directory); imported first")
    min_shard_bytes: int = _option(DEFAULT_MIN_SHARD_BYTES, "embedding tables are split over the ps tasks in "
                                   "shards of at least this many bytes (one shard per ps until they reach "
                                   "``max_shard_bytes``): a table under it stays in one piece")
    max_shard_bytes: int = _option(DEFAULT_MAX_SHARD_BYTES, "largest shard of an embedding table: a table larger "
                                   "than this times the ps count gets several shards per ps, so that a checkpoint "
                                   "save (one shard at a time) needs this much memory over the tables at most")
    ps_memory_limit: str | None = _option(None, "memory of one ps task (a quantity: ``4Gi``) to check embedding "
                                          "tables and their optimizer slots against before training; None: the ps "
                                          "role's ``resources`` (limits, else requests), else on a local group the "
                                          "memory available on the machine")

    def __post_init__(self) -> None:
        errors = self._coerce_types()
        if errors:
            raise ValueError("invalid training options:\n  " + "\n  ".join(errors))
        if not self.dataset:
            errors.append("dataset: a dataset directory is required")
        if not self.run_dir:
            errors.append("run_dir: a run directory is required")
        errors += [f"{what}: {problem}" for what, problem in (
            ("dataset", self.dataset and training_location_problem(self.dataset, "dataset")),
            ("run_dir", self.run_dir and training_location_problem(self.run_dir, "run_dir"))) if problem]
        if self.steps is None and self.epochs is None:
            errors.append("steps/epochs: set a target global step (steps) or a number of epochs")
        # Every number is checked for type, finiteness and range: a NaN learning rate would
        # otherwise train a NaN model and report success.
        for name, low, high, whole, optional in _NUMERIC_OPTIONS:
            value = getattr(self, name)
            if value is None and optional:
                continue
            problem = _number_problem(value, low, high, whole)
            if problem:
                errors.append(f"{name}: {problem}, got {value!r}")
        errors += self._choice_errors()
        if errors:
            raise ValueError("invalid training options:\n  " + "\n  ".join(errors))

    def _choice_errors(self) -> list[str]:
        """The options that name one of a fixed set (optimizer, model, mode, on_nan)."""
        errors = []
        if self.optimizer not in OPTIMIZERS:
            errors.append(f"optimizer: {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.model not in BUILTIN_MODELS and ":" not in self.model:
            errors.append(
                f"model: {self.model!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) "
                "nor an import path 'package.module:function'"
            )
        if self.mode not in MODES:
            errors.append(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        elif self.mode == "coordinator" and self.optimizer == "lazy_adam":
            errors.append("optimizer: 'lazy_adam' updates the embedding rows a step looked up on the ps, which only "
                          "mode='between_graph' does; use another optimizer or mode='between_graph'")
        elif self.mode == "coordinator" and self.sync:
            errors.append("sync: coordinator mode updates the parameters asynchronously only; "
                          "drop sync=True or use mode='between_graph'")
        if isinstance(self.min_shard_bytes, int) and isinstance(self.max_shard_bytes, int) and \
                self.min_shard_bytes > self.max_shard_bytes:
            errors.append(f"max_shard_bytes: {self.max_shard_bytes:,} is below min_shard_bytes={self.min_shard_bytes:,}; "
                          "raise it or lower min_shard_bytes")
        if self.ps_memory_limit is not None:
            try:
                memory_bytes(self.ps_memory_limit)
            except ValueError as err:
                errors.append(f"ps_memory_limit: {err}")
        if self.on_nan not in ON_NAN:
            errors.append(f"on_nan: {self.on_nan!r} is not one of {', '.join(ON_NAN)}")
        return errors

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
                errors.append(f"{f.name}: {value!r} is not a valid {kind.split(' ', maxsplit=1)[0]}")
        return errors

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingConfig:
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
    def from_args(cls, argv: list[str] | None = None) -> TrainingConfig:
        return cls.from_namespace(argument_parser().parse_args(argv))

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, **overrides: Any) -> TrainingConfig:
        """The training options among parsed arguments (other arguments are ignored)."""
        values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)}
        return cls(**{**values, **overrides})


# (option, lowest, highest, whole number, may be None)
_NUMERIC_OPTIONS = (
    ("learning_rate", 1e-12, 1e3, False, False),
    ("batch_size", 1, 1 << 20, True, False),
    ("steps", 1, 10**12, True, True),
    ("epochs", 1e-6, 1e6, False, True),
    ("replicas_to_aggregate", 1, 10**4, True, True),
    ("checkpoint_every_secs", 0.1, 86400.0, False, False),
    ("log_every_secs", 0.05, 3600.0, False, False),
    ("intra_op_threads", 0, 1024, True, False),
    ("inter_op_threads", 0, 1024, True, False),
    ("seed", 0, 2**31 - 1, True, False),
    ("devices_per_worker", 1, 64, True, True),
    ("operation_timeout_secs", 1.0, 86400.0, False, False),
    ("summary_every_steps", 1, 10**9, True, False),
    ("min_shard_bytes", 1, 2**50, True, False),
    ("max_shard_bytes", 1, 2**50, True, False),
)


def _number_problem(value: Any, low: float, high: float, whole: bool) -> str | None:
    """Why ``value`` is not a usable option in [low, high], or None."""
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be {kind}"
    if not math.isfinite(value):
        return "must be finite"
    if whole and value != int(value):
        return "must be a whole number"
    if not low <= value <= high:
        shown = (f"{int(low):,}", f"{int(high):,}") if whole else (f"{low:g}", f"{high:g}")
        return f"must be between {shown[0]} and {shown[1]}"
    return None


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
    default = {f.name: f.default for f in dataclasses.fields(TrainingConfig) if f.default is not dataclasses.MISSING}
    add("--dataset", required="dataset" not in defaults,
        help="dataset directory written by PrepareTFRecords / airflow-tf prepare (must hold _SUCCESS)")
    add("--run-dir", dest="run_dir", required="run_dir" not in defaults,
        help="directory for checkpoints, event files and progress.json, shared by all tasks")
    add("--model", default=default["model"],
        help=f"built-in model ({', '.join(BUILTIN_MODELS)}) or package.module:function")
    add("--model-kwargs", dest="model_kwargs", type=json.loads, default={}, metavar="JSON",
        help="keyword arguments of the model function, as a JSON object")
    add("--loss", default=default["loss"], help="Keras loss name (default: chosen from the label)")
    add("--optimizer", default=default["optimizer"], choices=OPTIMIZERS)
    add("--learning-rate", dest="learning_rate", type=float, default=default["learning_rate"])
    add("--batch-size", dest="batch_size", type=int, default=default["batch_size"], help="examples per trainer per step")
    add("--steps", type=int, default=default["steps"], help="target global step")
    add("--epochs", type=float, default=default["epochs"], help="passes over the training split (instead of --steps)")
    add("--sync", action="store_true", help="synchronous updates (SyncReplicasOptimizer)")
    add("--replicas-to-aggregate", dest="replicas_to_aggregate", type=int, default=default["replicas_to_aggregate"],
        help="sync mode: gradients per step (below the worker count, a slow worker stalls no one)")
    add("--checkpoint-every-secs", dest="checkpoint_every_secs", type=float, default=default["checkpoint_every_secs"])
    add("--log-every-secs", dest="log_every_secs", type=float, default=default["log_every_secs"])
    add("--intra-op-threads", dest="intra_op_threads", type=int, default=default["intra_op_threads"], help="threads per op in each task")
    add("--inter-op-threads", dest="inter_op_threads", type=int, default=default["inter_op_threads"], help="ops run at once in each task")
    add("--seed", type=int, default=default["seed"])
    add("--warm-start-from", dest="warm_start_from", default=default["warm_start_from"],
        help="run directory or checkpoint prefix to initialise the model weights from (first start only)")
    add("--mode", default=default["mode"], choices=MODES,
        help="between_graph: each worker drives itself (async or sync); coordinator: the chief drives "
        "the group with ParameterServerStrategy (async only)")
    add("--devices-per-worker", dest="devices_per_worker", type=int, default=default["devices_per_worker"],
        help="towers per worker, gradients averaged before the update (default: the worker's GPUs, else 1)")
    add("--on-nan", dest="on_nan", default=default["on_nan"], choices=ON_NAN,
        help="a loss that becomes NaN/inf fails the run (fail) or stops it keeping the last finite checkpoint (stop)")
    add("--operation-timeout-secs", dest="operation_timeout_secs", type=float,
        default=default["operation_timeout_secs"],
        help="a session step stuck longer than this errors and the session recovers")
    add("--summary-every-steps", dest="summary_every_steps", type=int, default=default["summary_every_steps"],
        help="write summaries every N global steps (and every --log-every-secs)")
    add("--code-dir", dest="code_dir", default=default["code_dir"],
        help="snapshot of the model's code to import first (the launch writes it into the run directory)")
    add("--min-shard-bytes", dest="min_shard_bytes", type=int, default=default["min_shard_bytes"],
        help="embedding tables are split over the ps tasks in shards of at least this many bytes")
    add("--max-shard-bytes", dest="max_shard_bytes", type=int, default=default["max_shard_bytes"],
        help="largest shard of an embedding table (bigger tables get several shards per ps)")
    add("--ps-memory-limit", dest="ps_memory_limit", default=default["ps_memory_limit"],
        help="memory of one ps task (e.g. 4Gi) to check embedding tables against before training "
        "(default: the ps role's resources, else the memory available on a local machine)")
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
    return strip_file_scheme(value)
