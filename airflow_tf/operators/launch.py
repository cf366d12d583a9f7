"""LaunchTFClusterOperator: starts (or re-attaches to) a parameter-server/worker group."""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any, ClassVar
from collections.abc import Sequence

from airflow.sdk import BaseOperator

from airflow_tf.compat import task_state_store
from airflow_tf.backends import BACKENDS, BackendError, GroupRef, backend_for, check_backend_options, get_backend
from airflow_tf.backends.ownership import (NotOurGroupError, RunDirTakenError, RunLaunch, check_ours, claim_run_dir,
                                           intent, record_of)
from airflow_tf.cluster import GroupSpec, SpecError, TrainingConfig, group_name
from airflow_tf.cluster.results import LaunchResult
from airflow_tf.cluster.group_options import LAUNCH_OPTIONS, GroupOptions, bounds, group_parameter_docs
from airflow_tf.cluster.spec import (DEFAULT_BACKOFF_LIMIT, DEFAULT_PORT, DEFAULT_PS, DEFAULT_SUCCESS_POLICY,
                                     DEFAULT_WORKERS)
from airflow_tf.cluster.model_code import snapshot_model_code
from airflow_tf.cluster.training import RENAMED_OPTIONS, dataset_uri_of, is_unset, parse_bool
from airflow_tf.deprecation import renamed
from airflow_tf.plugins.links import TensorBoardLink
from airflow_tf.storage import check_in_team_root, runs_dir, team_of

from .common import deprecated, is_template, launch_labels, no_retry_for, resolved_backend
from .lineage import LineageMethods, training_lineage

# Every TrainingConfig option a DAG author sets is an explicit parameter of the operator, so
# Airflow's .partial()/.expand() validation sees it; dataset, run_dir and sync are group-level
# parameters, and code_dir is written by the launch itself.
TRAINING_OPTIONS = tuple(f.name for f in dataclasses.fields(TrainingConfig)
                         if f.name not in ("dataset", "run_dir", "sync", "code_dir"))


def _holds_template(value: Any) -> bool:
    """Whether any value inside ``value`` is only known when the task runs (Jinja text, an XComArg)."""
    if isinstance(value, dict):
        return any(_holds_template(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_template(v) for v in value)
    return is_template(value)


def _whole(value: Any, name: str) -> int:
    """A task count that may arrive as rendered template text ("2"), within its declared bounds."""
    try:
        number = int(str(value).strip()) if isinstance(value, str) else value
    except ValueError:
        number = None
    if isinstance(number, bool) or not isinstance(number, int) or number < bounds(name).low:
        raise ValueError(f"{name}: expected a whole number >= {bounds(name).low:g}, got {value!r}")
    return number


class LaunchTFClusterOperator(LineageMethods, BaseOperator):
    """Launches a TensorFlow training group and returns (XCom) a
    :class:`~airflow_tf.cluster.results.LaunchResult` as a dict.

    The group name derives from the dag id, task id, run id and map index, so a retry of this
    task finds the group it already launched and re-attaches instead of starting another, and
    each mapped instance (``.partial(...).expand(learning_rate=[...])``) trains its own group
    in its own run directory.

    On Airflow 3.3 and later the launch also records what it created (the group's name and
    uid: the root Job's uid on Kubernetes, the group's id on the local backend) in the task
    state store, and a retry re-attaches only to that group: a group of the same name that
    this task did not create fails the launch, naming it, instead of being taken as its own.
    Before 3.3 a retry re-attaches by name alone.

    Every parameter is templated; every one works in ``.partial()`` and ``.expand()``. The
    training options (``model`` to ``ps_memory_limit`` below, and ``sync``) are the fields of
    :class:`~airflow_tf.cluster.TrainingConfig`, and the group options (``ps`` to ``pass_env``)
    those of :class:`~airflow_tf.cluster.group_options.GroupOptions`, with their defaults and
    documentation.

    :param dataset: dataset directory, or the prepare task's XCom (``prepare.output``).
    {training_options}
    {group_options}
    :param run_dir: checkpoints and event files; default ``<storage>/runs/<group name>``.
    :param backend: ``local`` (processes on this machine) or ``kubernetes``; None (default): the
        deployment's, ``[airflow_tf] backend``, else ``local``.
    :param backend_options: e.g. ``{"state_dir": ...}`` for local, or ``{"kubernetes_conn_id":
        ..., "namespace": ...}`` for kubernetes (``"workload": "jobset"`` makes the group one JobSet,
        which a Kueue ``queue_name`` requires; a queue with the default ``"jobs"`` is refused here).
    :param image: the training image (kubernetes).
    :param role_options: per role ``RoleSpec`` fields: ``{"worker": {"resources": {...}}}``.
    :param group_name: a fixed group name instead of the derived one.
    :param training: deprecated since 0.2.0, removed in 0.3.0: a dict of the training options
        above (``{"steps": 300, "learning_rate": 0.1}``); pass each as its own parameter.
    :param min_shard_bytes: deprecated since 0.2.0, removed in 0.3.0: ``min_slice_bytes``.
    :param max_shard_bytes: deprecated since 0.2.0, removed in 0.3.0: ``max_slice_bytes``.
    """

    template_fields: Sequence[str] = (
        "dataset", "run_dir", "ps", "workers", "chief", "sync", *TRAINING_OPTIONS, "backend_options", "image",
        "group_name",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {"model_kwargs": "json", "backend_options": "json"}
    operator_extra_links = (TensorBoardLink(),)
    ui_color = "#ffcc80"
    _lineage = training_lineage

    # The training options' defaults are TrainingConfig's (model_kwargs: None stands for its empty dict).
    def __init__(self, *, dataset: Any, model: str = TrainingConfig.model,
                 steps: int | str | None = TrainingConfig.steps, epochs: float | str | None = TrainingConfig.epochs,
                 learning_rate: float | str = TrainingConfig.learning_rate,
                 batch_size: int | str = TrainingConfig.batch_size, optimizer: str = TrainingConfig.optimizer,
                 loss: str | None = TrainingConfig.loss, model_kwargs: dict[str, Any] | None = None,
                 ps: int | str = DEFAULT_PS, workers: int | str = DEFAULT_WORKERS, chief: int | str = GroupOptions.chief,
                 sync: bool | str = TrainingConfig.sync,
                 replicas_to_aggregate: int | str | None = TrainingConfig.replicas_to_aggregate,
                 mode: str = TrainingConfig.mode, devices_per_worker: int | str | None = TrainingConfig.devices_per_worker,
                 on_nan: str = TrainingConfig.on_nan, warm_start_from: str | None = TrainingConfig.warm_start_from,
                 checkpoint_every_secs: float | str = TrainingConfig.checkpoint_every_secs,
                 log_every_secs: float | str = TrainingConfig.log_every_secs,
                 summary_every_steps: int | str = TrainingConfig.summary_every_steps,
                 operation_timeout_secs: float | str = TrainingConfig.operation_timeout_secs,
                 in_memory_input_bytes: int | str = TrainingConfig.in_memory_input_bytes,
                 steps_per_call: int | str | None = TrainingConfig.steps_per_call,
                 variable_placement: str = TrainingConfig.variable_placement,
                 intra_op_threads: int | str | None = TrainingConfig.intra_op_threads,
                 inter_op_threads: int | str = TrainingConfig.inter_op_threads, seed: int | str = TrainingConfig.seed,
                 min_slice_bytes: int | str = TrainingConfig.min_slice_bytes,
                 max_slice_bytes: int | str = TrainingConfig.max_slice_bytes,
                 ps_memory_limit: str | None = TrainingConfig.ps_memory_limit, run_dir: str | None = None,
                 backend: str | None = None, backend_options: dict[str, Any] | None = None, image: str | None = None,
                 role_options: dict[str, dict[str, Any]] | None = None, backoff_limit: int = DEFAULT_BACKOFF_LIMIT,
                 active_deadline_seconds: float | None = None, success_policy: str = DEFAULT_SUCCESS_POLICY,
                 port: int = DEFAULT_PORT, group_name: str | None = None, training: dict[str, Any] | None = None,
                 isolate_network: bool = GroupOptions.isolate_network, pass_env: Sequence[str] | None = None,
                 min_shard_bytes: int | str | None = None, max_shard_bytes: int | str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dataset = dataset
        self.model = model
        self.steps = steps
        self.epochs = epochs
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.loss = loss
        self.model_kwargs = model_kwargs or {}
        self.ps, self.workers, self.chief, self.sync = ps, workers, chief, sync
        self.replicas_to_aggregate = replicas_to_aggregate
        self.mode = mode
        self.devices_per_worker = devices_per_worker
        self.on_nan = on_nan
        self.warm_start_from = warm_start_from
        self.checkpoint_every_secs = checkpoint_every_secs
        self.log_every_secs = log_every_secs
        self.summary_every_steps = summary_every_steps
        self.operation_timeout_secs = operation_timeout_secs
        self.in_memory_input_bytes = in_memory_input_bytes
        self.steps_per_call = steps_per_call
        self.variable_placement = variable_placement
        self.intra_op_threads = intra_op_threads
        self.inter_op_threads = inter_op_threads
        self.seed = seed
        self.min_slice_bytes = renamed(type(self).__name__, "min_shard_bytes", "min_slice_bytes",
                                       min_shard_bytes, min_slice_bytes, unset=TrainingConfig.min_slice_bytes)
        self.max_slice_bytes = renamed(type(self).__name__, "max_shard_bytes", "max_slice_bytes",
                                       max_shard_bytes, max_slice_bytes, unset=TrainingConfig.max_slice_bytes)
        self.ps_memory_limit = ps_memory_limit
        self.run_dir = run_dir
        self.backend = backend
        self.backend_options = backend_options
        self.image = image
        self.role_options = role_options or {}
        self.backoff_limit = backoff_limit
        self.active_deadline_seconds = active_deadline_seconds
        self.success_policy = success_policy
        self.port = port
        self.group_name = group_name
        self.isolate_network = parse_bool(isolate_network, "isolate_network")
        self.pass_env = list(pass_env or [])
        if training is not None:
            self._set_deprecated_training(training)
        if backend == "kubernetes":
            # Refused now rather than at launch: a queue with the two-Job form, an unknown workload.
            from airflow_tf.backends.kubernetes.workloads import check_launch_options

            check_launch_options(self.backend_options, self.role_options)
        if backend in BACKENDS and isinstance(backend_options, dict) and not _holds_template(backend_options):
            # Refused while the DAG is parsed rather than at launch: a wrong key, type or range.
            check_backend_options(backend, backend_options, "backend_options")

    def _set_deprecated_training(self, training: Any) -> None:
        """The first release's ``training={...}``: each key becomes its own (templated) parameter."""
        deprecated("LaunchTFClusterOperator(training={...})",
                   "one parameter per option, e.g. LaunchTFClusterOperator(steps=300, learning_rate=0.1)")
        if not isinstance(training, dict):
            raise TypeError(f"training: expected a dict of training options, got {training!r}")
        training = dict(training)
        for old, new in RENAMED_OPTIONS.items():
            if old in training:
                training[new] = renamed(type(self).__name__, old, new, training.pop(old),
                                        training.get(new))
        unknown = sorted(set(training) - set(TRAINING_OPTIONS))
        if unknown:
            raise ValueError(f"training: unknown option(s) {', '.join(unknown)}; the options are "
                             f"{', '.join(TRAINING_OPTIONS)}")
        defaults = inspect.signature(LaunchTFClusterOperator.__init__).parameters
        for name, value in training.items():
            current = getattr(self, name)
            if current != defaults[name].default and current not in ({}, value):
                raise ValueError(f"training: {name} is given twice ({name}={current!r} and training[{name!r}]="
                                 f"{value!r}); pass it once, as {name}=")
            setattr(self, name, value)

    def training_options(self) -> dict[str, Any]:
        """The TrainingConfig options as set (rendered) on this task; '' and 'None' from a
        template that rendered nothing mean unset."""
        options = {}
        for name in TRAINING_OPTIONS:
            value = getattr(self, name)
            if not is_unset(value):
                options[name] = value
        return options

    def build_spec(self, context: Any) -> GroupSpec:
        """The group this task launches (snapshotting the model's code into the run directory)."""
        return self._plan(context)[0]

    def _plan(self, context: Any) -> tuple[GroupSpec, str | None]:
        """The group this task launches, and the hash of the model code it snapshotted (None
        when the model's code comes from an installed package or the training image)."""
        ti = context["ti"]
        map_index = _map_index(ti)
        name = self.group_name or group_name(ti.dag_id, ti.task_id, ti.run_id, map_index)
        run_dir = self.run_dir or os.path.join(runs_dir(), name)
        check_in_team_root(run_dir, "run_dir")
        config = TrainingConfig(dataset=dataset_uri_of(self.dataset), run_dir=run_dir,
                                sync=parse_bool(self.sync, "sync"), **self.training_options())
        # Before the model's code is written there: the run directory's record of its launch is
        # what the TensorBoard mount and the Training view trust to decide who may read the run.
        claim_run_dir(run_dir, RunLaunch(ti.dag_id, ti.run_id, ti.task_id, map_index))
        config, code_hash = self._with_model_code(config)
        labels = {**launch_labels(ti.dag_id, ti.task_id, ti.run_id, map_index),
                  "airflow.try_number": str(ti.try_number)}
        spec = GroupSpec.for_training(
            name, config, ps=_whole(self.ps, "ps"), workers=_whole(self.workers, "workers"),
            chief=_whole(self.chief, "chief"), image=self.image, role_options=self.role_options,
            backoff_limit=self.backoff_limit, active_deadline_seconds=self.active_deadline_seconds,
            success_policy=self.success_policy, port=self.port, labels=labels,
            isolate_network=self.isolate_network, pass_env=self.pass_env,
        )
        return spec, code_hash

    def _with_model_code(self, config: TrainingConfig) -> tuple[TrainingConfig, str | None]:
        """Snapshots the model's module into the run directory (when it is not an installed
        package), so every task, the evaluation and the export import that code first; returns
        the config reading the snapshot and the snapshot's hash (None: nothing snapshotted)."""
        snapshot = snapshot_model_code(config.model, config.run_dir)
        if snapshot is None:
            return config, None
        path, digest = snapshot
        self.log.info("model code %s snapshotted into %s (sha256 %s)", config.model, path, digest)
        return TrainingConfig.from_dict({**config.to_dict(), "code_dir": str(path)}), digest

    def execute(self, context: Any) -> dict[str, Any]:
        # A bad option or spec, or a model that cannot be found, fails at once: retrying cannot fix it.
        with no_retry_for(ValueError, SpecError, RunDirTakenError, what="launch refused"):
            spec, code_hash = self._plan(context)
            backend_name, options = resolved_backend(self.backend, self.backend_options, team_of(context))
            backend = get_backend(backend_name, **options)
        existing = backend.find(spec.name)
        store = task_state_store(context)  # Airflow 3.3+: kept across the retries of this task
        if store is None:
            # Older Airflow: a retry re-attaches to the group of its (deterministic) name.
            self.log.info("no task state store (Airflow before 3.3): a retry re-attaches to group %s by name alone",
                          spec.name)
        else:
            who = f"this launch ({_launch_identity(context['ti'])})"
            with no_retry_for(NotOurGroupError, what="launch refused"):
                if not check_ours(spec.name, store.get(GROUP_RECORD_KEY), existing, who):
                    store.set(GROUP_RECORD_KEY, intent(spec.name))  # before creating: see backends/ownership.py
        # launch() is idempotent: on a retry it re-attaches, creating only what an interrupted
        # first try left missing.
        ref = backend.launch(spec)
        self._launched = ref
        if store is not None:
            store.set(GROUP_RECORD_KEY, record_of(ref))
        if existing is not None:
            self.log.info("re-attaching to training group %s (uid %s) launched by an earlier try", spec.name, ref.uid)
        else:
            self.log.info("launched training group %s (uid %s) on %s: %s", spec.name, ref.uid, backend_name,
                          ", ".join(f"{spec.replicas(r)} {r}" for r in spec.roles if spec.replicas(r)))
        assert spec.training is not None
        if spec.training.warm_start_from:
            self.log.info("warm start: the model begins from checkpoint %s", spec.training.warm_start_from)
        result = LaunchResult(
            group=ref.to_dict(), run_dir=spec.training.run_dir, dataset=spec.training.dataset,
            training=spec.training.to_dict(), reattached=existing is not None,
            map_index=_map_index(context["ti"]), code_hash=code_hash,
        ).to_dict()
        # Last: until the group is handed over, a launch killed now (before its XCom exists)
        # takes its group down with it instead of leaving it running unreferenced.
        backend.hand_over(ref)
        self._lineage_result = result
        return result

    def on_kill(self) -> None:
        ref: GroupRef | None = getattr(self, "_launched", None)
        if ref is not None:
            try:
                backend_for(ref).teardown(ref)
            except BackendError as exc:
                self.log.warning("launch killed: could not tear down group %s: %s", ref.name, exc)
                return
            self.log.info("launch killed: tore down group %s", ref.name)


def _training_option_docs(doc: str) -> str:
    """``doc`` with its ``{training_options}`` line replaced by a ``:param:`` line per training
    option (and ``sync``): TrainingConfig's documentation of the option."""
    lines = [f":param {option.name}: {option.metadata['doc']}." for option in dataclasses.fields(TrainingConfig)
             if option.name in (*TRAINING_OPTIONS, "sync")]
    return doc.replace("{training_options}", "\n    ".join(lines))


LaunchTFClusterOperator.__doc__ = _training_option_docs(LaunchTFClusterOperator.__doc__ or "").replace(
    "{group_options}", group_parameter_docs(LAUNCH_OPTIONS))


GROUP_RECORD_KEY = "airflow_tf.training_group"
"""The task state store's key of what this launch created: ``{"name", "uid", "backend", "namespace"}``."""


def _launch_identity(ti: Any) -> str:
    return f"dag {ti.dag_id}, run {ti.run_id}, task {ti.task_id}, map index {_map_index(ti)}"


def _map_index(ti: Any) -> int:
    """The task instance's map index; -1 when the task is not mapped."""
    map_index = getattr(ti, "map_index", -1)
    return -1 if map_index is None else int(map_index)
