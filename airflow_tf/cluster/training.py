"""What every task of a group is asked to do: the training options.

One definition serves both sides: the launcher turns a :class:`TrainingConfig` into
``python -m airflow_tf.runtime`` arguments (:meth:`TrainingConfig.to_args`), and the runtime
parses them back with :func:`argument_parser` (:meth:`TrainingConfig.from_args`)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_tf.deprecation import deprecated, renamed
from airflow_tf.files import strip_file_scheme, training_location_problem

from .memory import memory_bytes

OPTIMIZERS = ("sgd", "adam", "adagrad", "rmsprop", "lazy_adam", "ftrl")
"""``lazy_adam`` is Adam that updates the moments of the embedding rows a step looked up only
(``adam`` decays every row's moments every step); ``ftrl`` is TensorFlow's FTRL-Proximal."""
DEFAULT_MIN_SLICE_BYTES = 16 * 2**20
DEFAULT_MAX_SLICE_BYTES = 128 * 2**20
RENAMED_OPTIONS = {"min_shard_bytes": "min_slice_bytes", "max_shard_bytes": "max_slice_bytes"}
"""Old name -> new name of the training options renamed in 0.2.0 ("shard" is a training file,
an embedding table's piece a slice). The old names still work, as keywords, dict keys and
flags, with AirflowTFDeprecationWarning, until 0.3.0."""
DEFAULT_IN_MEMORY_INPUT_BYTES = 256 * 2**20
MAX_IN_MEMORY_INPUT_BYTES = 2**30
"""The share is held in the training graph as constants, which TensorFlow limits to 2 GiB a graph."""
BUILTIN_MODELS = ("linear_regression", "mlp_classifier")
MODES = ("between_graph", "coordinator")
"""``between_graph``: every worker builds its own graph (TF1-compat replication, async or sync).
``coordinator``: one chief drives the group with ``ParameterServerStrategy`` (async only)."""
ON_NAN = ("fail", "stop")
"""What a loss that becomes NaN/inf does: fail the run, or stop and keep the last finite checkpoint."""
VARIABLE_PLACEMENTS = ("auto", "ps")
"""``ps``: every step reads the variables from the ps and updates them there. ``auto``: a sole
trainer keeps them and pushes them to copies on the ps after each call (coordinator mode, whose
chief schedules steps on the workers, keeps them on the ps)."""


def _option(default: Any = dataclasses.MISSING, doc: str = "", *, bounds: tuple[float, float] | None = None,
            choices: tuple[str, ...] | None = None) -> Any:
    """A training option, declared once: its default, its one-line documentation, and for a
    number the range it must lie in, for a name the values it may take. The launch operator's
    parameters and reference, the command line's flags and the validation all read these
    (``dataclasses.fields(TrainingConfig)``)."""
    metadata: dict[str, Any] = {"doc": doc}
    if bounds is not None:
        metadata["bounds"] = bounds
    if choices is not None:
        metadata["choices"] = choices
    return field(default=default, metadata=metadata)


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "none", "")
"""``none`` and ``""``: a template that rendered an unset value."""


def is_unset(value: Any) -> bool:
    """None, or what a template renders for an unset value ('' or 'None'): the option's default."""
    return value is None or (isinstance(value, str) and value.strip() in ("", "None"))


def parse_bool(value: Any, name: str) -> bool:
    """A true/false option as a template renders it (``"True"``, ``"false"``, ``"1"``) or as
    given; anything else raises ValueError naming the option, never a silent False."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ValueError(f"{name}: expected true or false, got {value!r}")


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
                             "only the embedding rows a step looked up) or ``ftrl``", choices=OPTIMIZERS)
    learning_rate: float = _option(0.01, "the optimizer's learning rate", bounds=(1e-12, 1e3))
    batch_size: int = _option(64, "examples per worker per step", bounds=(1, 1 << 20))
    steps: int | None = _option(None, "target global step (set ``steps`` or ``epochs``; ``steps`` wins when both)",
                                bounds=(1, 10**12))
    epochs: float | None = _option(None, "passes over the training split, instead of ``steps``", bounds=(1e-6, 1e6))
    sync: bool = _option(False, "synchronous updates (``SyncReplicasOptimizer``) instead of asynchronous")
    replicas_to_aggregate: int | None = _option(None, "sync mode: gradients aggregated per step (below the worker "
                                                "count, a slow worker stalls no one); None: every worker's",
                                                bounds=(1, 10**4))
    checkpoint_every_secs: float = _option(10.0, "seconds between checkpoints", bounds=(0.1, 86400.0))
    log_every_secs: float = _option(2.0, "seconds between progress lines in the task logs", bounds=(0.05, 3600.0))
    intra_op_threads: int | None = _option(None, "threads per TensorFlow op in each task (0: TensorFlow's choice). "
                                           "None: 1 on a ps; on a training task its share of the cores its "
                                           "container may use among the training tasks on its machine",
                                           bounds=(0, 1024))
    inter_op_threads: int = _option(2, "TensorFlow ops run at once in each task", bounds=(0, 1024))
    seed: int = _option(0, "random seed of the model and the input pipeline", bounds=(0, 2**31 - 1))
    warm_start_from: str | None = _option(None, "run directory or checkpoint prefix to initialise the weights "
                                          "from (first start only; an export records one in its metadata's "
                                          "``warm_start_from``)")
    mode: str = _option("between_graph", "``between_graph`` (each worker drives itself) or ``coordinator`` (the "
                        "chief drives the group with ``ParameterServerStrategy``; asynchronous only)", choices=MODES)
    devices_per_worker: int | None = _option(None, "towers per worker, gradients averaged before the update; "
                                             "None: the worker's GPUs, else 1", bounds=(1, 64))
    on_nan: str = _option("fail", "a loss that becomes NaN/inf fails the run (``fail``) or stops it keeping the "
                          "last finite checkpoint (``stop``)", choices=ON_NAN)
    operation_timeout_secs: float = _option(300.0, "bound on one session step: a step stuck longer errors and "
                                            "the session recovers", bounds=(1.0, 86400.0))
    in_memory_input_bytes: int = _option(DEFAULT_IN_MEMORY_INPUT_BYTES, "a trainer whose share of the training "
                                         "split, parsed, fits in this many bytes reads and parses it once and "
                                         "trains from memory (the share reshuffled every epoch); a larger share "
                                         "streams from the files. 0: always stream",
                                         bounds=(0, MAX_IN_MEMORY_INPUT_BYTES))
    steps_per_call: int | None = _option(None, "training steps a trainer runs per TensorFlow call, chained in the "
                                         "graph (each on its own batch, after the previous update): fewer calls, "
                                         "less fixed cost per step. None: chosen from the step time (several for "
                                         "quick steps, 1 for slow ones; 10 per scheduled function in coordinator "
                                         "mode). Sync mode runs 1", bounds=(1, 1000))
    variable_placement: str = _option("auto", "where a trainer's variables live between its steps: ``ps`` (read "
                                      "from the parameter servers, each step's update applied there) or ``auto`` "
                                      "(the same, except that a sole trainer (one worker or chief, asynchronous, one "
                                      "tower) keeps them and pushes them to their copies on the ps after each call; "
                                      "checkpoints are saved from the copies). Embedding tables split over the ps "
                                      "stay there", choices=VARIABLE_PLACEMENTS)
    summary_every_steps: int = _option(100, "TensorBoard summaries (loss, examples/s, learning rate) every N "
                                       "global steps, besides every ``log_every_secs``", bounds=(1, 10**9))
    code_dir: str | None = _option(None, "snapshot of the model's code (written by the launch into the run "
                                   "directory); imported first")
    min_slice_bytes: int = _option(DEFAULT_MIN_SLICE_BYTES, "embedding tables are split over the ps tasks in "
                                   "slices of at least this many bytes (one slice per ps until they reach "
                                   "``max_slice_bytes``): a table under it stays in one piece", bounds=(1, 2**50))
    max_slice_bytes: int = _option(DEFAULT_MAX_SLICE_BYTES, "largest slice of an embedding table: a table larger "
                                   "than this times the ps count gets several slices per ps, so that a checkpoint "
                                   "save (one slice at a time) needs this much memory over the tables at most",
                                   bounds=(1, 2**50))
    ps_memory_limit: str | None = _option(None, "memory of one ps task (a quantity: ``4Gi``) to check embedding "
                                          "tables and their optimizer slots against before training; None: the ps "
                                          "role's ``resources`` (limits, else requests), else on a local group the "
                                          "memory available on the machine")
    # The deprecated names of min/max_slice_bytes (RENAMED_OPTIONS) are no fields: __init__ takes
    # them as keywords and they read as properties (_take_renamed_options, below the class).

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
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if "bounds" not in f.metadata or (value is None and _optional(f)):
                continue
            problem = _number_problem(value, *f.metadata["bounds"], whole=_kind(f) == "int")
            if problem:
                errors.append(f"{f.name}: {problem}, got {value!r}")
        errors += self._choice_errors()
        if errors:
            raise ValueError("invalid training options:\n  " + "\n  ".join(errors))

    def _choice_errors(self) -> list[str]:
        """The options that name one of a fixed set (optimizer, model, mode, on_nan)."""
        errors = [f"{f.name}: {getattr(self, f.name)!r} is not one of {', '.join(f.metadata['choices'])}"
                  for f in dataclasses.fields(self)
                  if "choices" in f.metadata and getattr(self, f.name) not in f.metadata["choices"]]
        if self.model not in BUILTIN_MODELS and ":" not in self.model:
            errors.append(
                f"model: {self.model!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) "
                "nor an import path 'package.module:function'"
            )
        if self.mode == "coordinator" and self.optimizer == "lazy_adam":
            errors.append("optimizer: 'lazy_adam' updates the embedding rows a step looked up on the ps, which only "
                          "mode='between_graph' does; use another optimizer or mode='between_graph'")
        elif self.mode == "coordinator" and self.sync:
            errors.append("sync: coordinator mode updates the parameters asynchronously only; "
                          "drop sync=True or use mode='between_graph'")
        if self.sync and isinstance(self.steps_per_call, int) and self.steps_per_call > 1:
            errors.append(f"steps_per_call: sync mode runs one step per call (each waits for the other workers' "
                          f"gradients), got {self.steps_per_call}; drop steps_per_call or sync=True")
        if isinstance(self.min_slice_bytes, int) and isinstance(self.max_slice_bytes, int) and \
                self.min_slice_bytes > self.max_slice_bytes:
            errors.append(f"max_slice_bytes: {self.max_slice_bytes:,} is below "
                          f"min_slice_bytes={self.min_slice_bytes:,}; raise it or lower min_slice_bytes")
        if self.ps_memory_limit is not None:
            try:
                memory_bytes(self.ps_memory_limit, "ps_memory_limit")
            except ValueError as err:
                errors.append(str(err))
        return errors

    def _coerce_types(self) -> list[str]:
        """Templated Airflow arguments arrive as strings ("3000"): convert them by field type."""
        errors = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or value == "":
                continue
            kind = _kind(f)
            try:
                if kind == "int":
                    setattr(self, f.name, int(value))
                elif kind == "float":
                    setattr(self, f.name, float(value))
                elif kind == "bool":
                    setattr(self, f.name, parse_bool(value, f.name))
                elif kind == "dict":
                    setattr(self, f.name, json.loads(value))
            except ValueError as exc:
                errors.append(str(exc) if kind == "bool" else f"{f.name}: {value!r} is not a valid {kind}")
        return errors

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingConfig:
        """The options of ``to_dict``, or of a dict an earlier release wrote (a launch result, a
        local group's saved spec): its renamed keys are taken with their warning."""
        known = {f.name for f in dataclasses.fields(cls)} | set(RENAMED_OPTIONS)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown training option(s): {', '.join(unknown)}")
        return cls(**data)

    def to_args(self) -> list[str]:
        """Command-line arguments for ``python -m airflow_tf.runtime``."""
        args: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            flag = _flag(f.name)
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
        for old, new in RENAMED_OPTIONS.items():
            if getattr(ns, old, None) is not None:
                values[new] = _renamed_flag(old, new, getattr(ns, old), values.get(new))
        return cls(**{**values, **overrides})


_FIELDS = {f.name: f for f in dataclasses.fields(TrainingConfig)}


def _take_renamed_options(cls: type[TrainingConfig]) -> None:
    """``cls`` takes the deprecated names of :data:`RENAMED_OPTIONS` as keywords and reads them,
    each time with the warning. They are no fields: ``dataclasses.replace`` and ``asdict`` see
    the new names only."""
    dataclass_init = cls.__init__

    @functools.wraps(dataclass_init)
    def __init__(self: TrainingConfig, *args: Any, **kwargs: Any) -> None:
        for old, new in RENAMED_OPTIONS.items():
            if kwargs.get(old) is not None:
                kwargs[new] = renamed(cls.__name__, old, new, kwargs[old], kwargs.get(new), unset=_FIELDS[new].default)
            kwargs.pop(old, None)
        dataclass_init(self, *args, **kwargs)

    def renamed_attribute(old: str, new: str) -> property:
        def read(self: TrainingConfig) -> Any:
            deprecated(f"{cls.__name__}.{old}", f"{cls.__name__}.{new}")
            return getattr(self, new)

        def write(self: TrainingConfig, value: Any) -> None:
            deprecated(f"{cls.__name__}.{old}", f"{cls.__name__}.{new}")
            setattr(self, new, value)

        return property(read, write, doc=f"Deprecated since 0.2.0, removed in 0.3.0: :attr:`{new}`.")

    setattr(cls, "__init__", __init__)  # noqa: B010 (mypy refuses assigning to a method)
    for old, new in RENAMED_OPTIONS.items():
        setattr(cls, old, renamed_attribute(old, new))


_take_renamed_options(TrainingConfig)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _renamed_flag(old: str, new: str, old_value: Any, new_value: Any) -> Any:
    """The value of a renamed option given by its old flag, with the warning. The new flag given
    too is refused naming both, as :func:`~airflow_tf.deprecation.renamed` refuses keywords."""
    deprecated(_flag(old), f"{_flag(new)} (the same value)")
    if new_value not in (None, _FIELDS[new].default):
        raise ValueError(f"{_flag(old)} is the deprecated name of {_flag(new)}; give {_flag(new)} only "
                         f"(given {old_value} and {new_value})")
    return old_value


def _kind(option: dataclasses.Field) -> str:
    """An option's type without ``| None`` and parameters: int, float, str, bool or dict."""
    return str(option.type).split(" | ")[0].split("[")[0]


def _optional(option: dataclasses.Field) -> bool:
    return "None" in str(option.type).split(" | ")


def _number_problem(value: Any, low: float, high: float, *, whole: bool) -> str | None:
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


INTERNAL_OPTIONS = ("code_dir",)
"""Options the launch sets (the run's snapshot of the model code): flags, left out of ``--help``."""


def json_argument(expected: str, kind: type | tuple[type, ...] | None = None) -> Callable[[str], Any]:
    """An argparse ``type`` reading JSON given inline or as ``@FILE``; what is not JSON (or not
    of ``kind``) is refused with where it went wrong and ``expected`` (argparse adds the flag)."""
    def parse(text: str) -> Any:
        try:
            source = Path(text[1:]).read_text(encoding="utf-8") if text.startswith("@") else text
        except OSError as e:
            raise argparse.ArgumentTypeError(f"cannot read {text[1:]}: {e.strerror}; expected {expected}") from e
        try:
            value = json.loads(source)
        except json.JSONDecodeError as e:
            where = f"line {e.lineno} column {e.colno}" if "\n" in source else f"character {e.pos + 1}"
            raise argparse.ArgumentTypeError(f"{text if len(text) <= 80 else text[:77] + '...'!r} is not JSON "
                                             f"({e.msg} at {where}); expected {expected}") from e
        if kind is not None and not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"{text!r} is JSON but not {expected}")
        return value
    return parse


def add_training_arguments(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """Every training option as a command-line flag (the runtime's, ``airflow-tf run``'s and
    ``airflow-tf render``'s), made from its declaration: ``--learning-rate`` for
    ``learning_rate``, its type, default, choices and documentation. ``defaults`` overrides a
    default (and makes dataset or run_dir, otherwise required, optional)."""
    for option in dataclasses.fields(TrainingConfig):
        flag = _flag(option.name)
        # argparse formats help with %: a literal one is doubled.
        settings: dict[str, Any] = {"dest": option.name,
                                    "help": option.metadata["doc"].replace("``", "").replace("%", "%%")}
        if option.name in INTERNAL_OPTIONS:
            settings["help"] = argparse.SUPPRESS
        kind = _kind(option)
        if option.name in ("dataset", "run_dir"):
            parser.add_argument(flag, required=option.name not in defaults, **settings)
            continue
        if kind == "bool":
            parser.add_argument(flag, action="store_true", **settings)
            continue
        settings["default"] = option.default_factory() if option.default_factory is not dataclasses.MISSING \
            else option.default
        if kind == "dict":
            settings.update(type=json_argument('a JSON object, e.g. \'{"hidden_units": [64, 32]}\'', dict),
                            metavar="JSON|@FILE")
        elif kind in ("int", "float"):
            settings["type"] = int if kind == "int" else float
        if "choices" in option.metadata:
            settings["choices"] = option.metadata["choices"]
        parser.add_argument(flag, **settings)
    for old in RENAMED_OPTIONS:
        # Deprecated, unlisted like prepare's old flags; a task started by an earlier release's
        # launcher is given them.
        parser.add_argument(_flag(old), dest=old, type=int, help=argparse.SUPPRESS)
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
