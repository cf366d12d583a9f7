"""A trainer (the chief or a worker): between-graph replication in TF1-compat graph mode.

Every trainer builds its own graph: the variables are placed on the ps tasks (round robin, by
``replica_device_setter``), the input pipeline and the computation on this task; a sole trainer
keeps the variables and the ps their copies (see .kept_variables). The chief
initialises the variables or restores them from the newest intact checkpoint in the run
directory, checkpoints every ``checkpoint_every_secs`` seconds and at the end (never non-finite
variables), and reports progress. A NaN/inf loss fails or stops the task (``on_nan``); a step
far longer than the recent ones (see .step_bound; ``operation_timeout_secs`` at most) is
cancelled and the session recreated, as after a lost ps."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.training import monitored_session

from airflow_tf.cluster.training import TrainingConfig
from airflow_tf.data import make_dataset
from airflow_tf.data.errors import DataError
from airflow_tf.data.reader import EMPTY_SHARE_REMEDY

from .embeddings import SlicedTable, check_ps_memory, ps_table_budget, slice_embeddings, trainable_variables
from .kept_variables import KeptVariables, PullHook, keeps_variables, on_task
from .errors import TaskConfigError
from .logs import log
from .loop import (KEEP_CHECKPOINTS, NanPolicy, ProgressReport, Start, placement, prepare_run_dir, restore_refused,
                   starting_point, target_step, task_result)
from .models import build_model, compute_loss, matrix_model, resolve_loss, weight_key
from .optimizers import make_optimizer
from .session_hooks import FiniteSaver, QuickCloseCreator, SyncReplicasHook
from .step_bound import StepBoundHook
from .steps import AUTO_STEPS_PER_CALL, StepsPerCall, TrainingHook, chain_steps
from .task import Task, intra_op_threads, session_config
from .towers import tower_devices, towers_train_op

STOP_GRACE_SECS = 0.5
"""How long the chief waits for its sync queue runner at exit. The runner is then blocked for
good on gradients no worker will send, so TensorFlow's default (120 s) is pure idle time."""
WORKER_POLL_SECS = 0.2
"""How often a worker checks whether the chief has initialised the variables (TensorFlow's
default, 30 s, makes a worker that starts before the chief idle half a minute)."""
WORKER_MAX_WAIT_SECS = 30 * 60

# MonitoredSession recreates its session (the chief restoring the newest checkpoint) when a ps
# is lost (Aborted/Unavailable). A step that ran past operation_timeout_secs is the same fault:
# it surfaces as DeadlineExceeded, or as Cancelled when the master cancelled the step's other
# partitions first. It recovers the same way instead of failing the task. TensorFlow reads
# this tuple at each ``except``; there is no public option.
for _error in (tf.errors.DeadlineExceededError, tf.errors.CancelledError):
    if _error not in monitored_session._PREEMPTION_ERRORS:
        monitored_session._PREEMPTION_ERRORS += (_error,)

def replicas_to_aggregate(config: TrainingConfig, trainers: int) -> int:
    """Gradients per global step: 1 in async mode; in sync mode the option, else every trainer."""
    if not config.sync:
        return 1
    count = config.replicas_to_aggregate or trainers
    if count > trainers:
        raise TaskConfigError(
            f"replicas_to_aggregate={count} is more than the {trainers} training task(s) in TF_CONFIG: "
            "a synchronous step would never complete; lower it or add workers"
        )
    return count


STATE_UPDATES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def training_forward(model, features):
    """The model's predictions in training mode, and the variable writes the call made on the
    side (BatchNormalization's moving statistics, Dropout's seed state). Keras runs those
    eagerly; in a graph no output depends on them, so they must run with the train op."""
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    predictions = model(features, training=True)
    return predictions, [op for op in graph.get_operations()[first:] if op.type in STATE_UPDATES]


def checkpoint_variables(model, tables: Sequence[SlicedTable] = ()) -> dict[str, tf.Variable | list[tf.Variable]]:
    """Every global variable under its checkpoint name: the model's weights by position (see
    :mod:`.models`), the rest (global step, optimizer slots) by graph name. A sliced embedding
    table, and each optimizer slot of it, is the list of its slices under one name: the
    checkpoint holds it as one tensor (see :mod:`.embeddings`)."""
    sliced = {id(t.shadow): t.slices for t in tables}
    named: dict[str, tf.Variable | list[tf.Variable]] = {
        weight_key(i, w): sliced.get(id(w.value), w.value) for i, w in enumerate(model.weights)}
    in_model = {v.name for value in named.values() for v in (value if isinstance(value, list) else [value])}
    for variable in tf.compat.v1.global_variables():
        if variable.name in in_model:
            continue
        slice_info = variable._save_slice_info
        if slice_info is not None:  # a slice of an optimizer slot of a sliced table
            named.setdefault(slice_info.full_name, []).append(variable)
        else:
            named[variable.op.name] = variable
    return named


class WorkerSessionCreator(tf.compat.v1.train.SessionCreator):
    """A non-chief session: waits for the chief to initialise the variables, polling every
    ``poll_secs`` (``tf.compat.v1.train.WorkerSessionCreator`` polls every 30 s)."""

    def __init__(self, scaffold, master: str, config, poll_secs: float, max_wait_secs: float):
        self._scaffold = scaffold
        self._master = master
        self._config = config
        self._poll_secs = poll_secs
        self._max_wait_secs = max_wait_secs

    def create_session(self):
        self._scaffold.finalize()
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self._scaffold.local_init_op,
            local_init_feed_dict=self._scaffold.local_init_feed_dict,
            ready_op=self._scaffold.ready_op,
            ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
            graph=tf.compat.v1.get_default_graph(),
            recovery_wait_secs=self._poll_secs,
        )
        return manager.wait_for_session(self._master, config=self._config, max_wait_secs=self._max_wait_secs)


def _loss_and_train_op(model, features, labels, *, loss_fn, optimizer, global_step, var_list, task: Task,
                       devices: list[str]):
    """The batch's loss and the op of one training step: one tower per device, their gradients
    averaged (see :mod:`.towers`), or the model on the whole batch on the worker's one device."""
    if len(devices) > 1:
        return towers_train_op(model, features, labels, training_forward, lambda y, p: compute_loss(loss_fn, y, p),
                               optimizer=optimizer, global_step=global_step, var_list=var_list,
                               cluster=task.cluster, devices=devices)
    predictions, state_updates = training_forward(model, features)
    loss = compute_loss(loss_fn, labels, predictions)
    return loss, tf.group(optimizer.minimize(loss, global_step=global_step, var_list=var_list), *state_updates)


def _warm_start(start: Start, variables: dict):
    """The scaffold's ``init_fn``: None, or the warm start's restore of the model's weights (the
    other variables start new)."""
    if not start.warm_from:
        return None
    weights = {key: v for key, v in variables.items() if key.startswith("model/")}
    warm_saver = tf.compat.v1.train.Saver(var_list=weights)
    return lambda scaffold, session: warm_saver.restore(session, start.warm_from)


def _no_constant_folding(tf_config) -> None:
    """No constant folding in sessions over sliced tables: Grappler folds a slot's fill (an
    accumulator's initial value) into a constant the ps keeps for good, so the first sparse
    update copies the slot; and each ps evaluates a table's initial values to fold them whenever
    a graph is registered with it. Both cost the ps a table's memory."""
    tf_config.graph_options.rewrite_options.constant_folding = rewriter_config_pb2.RewriterConfig.OFF
    tf_config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    tf_config.graph_options.optimizer_options.do_common_subexpression_elimination = True


def _steps_per_call(config: TrainingConfig, towers: int) -> tuple[int, int | None]:
    """(K of the chain, the user's fixed choice or None): sync mode and towers run one step per
    call unless told otherwise (a sync step waits for the others; towers are for large steps)."""
    if config.sync:
        return 1, 1
    if config.steps_per_call is not None:
        return config.steps_per_call, config.steps_per_call
    return (AUTO_STEPS_PER_CALL if towers == 1 else 1), None


def _hooks(task: Task, bound: StepBoundHook, training: TrainingHook, sync_optimizer) -> list:
    """The session's hooks, in the order they run around each step."""
    hooks: list = [bound]  # the bound first: its clock spans the whole step
    if sync_optimizer is not None:
        hooks.append(SyncReplicasHook(sync_optimizer, task.is_chief))
    hooks.append(training)
    return hooks


# PLR0915: one graph is built in the order its session needs (ops, saver, hooks, session), each
# step using the ones before; the self-contained parts are the helpers above.
def train(config: TrainingConfig, task: Task, server, schema) -> dict:  # noqa: PLR0915
    """Train until the global step reaches the target; returns the task's result (its exit line)."""
    trainers = len(task.trainers)
    aggregate = replicas_to_aggregate(config, trainers)
    examples_per_step = config.batch_size * aggregate
    target = target_step(config, examples_per_step)
    resume_from = prepare_run_dir(config.run_dir, task.is_chief)

    devices = tower_devices(task.device, config.devices_per_worker)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(config.seed)
        setter = tf.compat.v1.train.replica_device_setter(
            cluster=tf.train.ClusterSpec(task.cluster), worker_device=task.device
        )
        keep = keeps_variables(config, trainers, len(devices))
        with tf.compat.v1.device(setter):
            global_step = tf.compat.v1.train.get_or_create_global_step()
            # A sole trainer builds the model's variables (and so its optimizer's slots) on itself.
            with tf.compat.v1.device(task.device) if keep else contextlib.nullcontext():
                model = build_model(config, schema)
            on_rows = matrix_model(model, schema, config.model)
            dataset = make_dataset(
                config.dataset, "train", config.batch_size, num_shards=trainers,
                shard_index=task.trainer_index, epochs=None, shuffle=True, seed=config.seed,
                in_memory_bytes=config.in_memory_input_bytes, features_as_matrix=on_rows is not None,
            )
            iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
            keys = {id(w.value): weight_key(i, w) for i, w in enumerate(model.weights)}
            tables = slice_embeddings(model, keys, task.ps_count, config.min_slice_bytes, config.max_slice_bytes)
            check_ps_memory(tables, config.optimizer, task.ps_count, ps_table_budget(config.ps_memory_limit, task.ps_count))
            optimizer = make_optimizer(config)
            sync_optimizer = None
            if config.sync:
                optimizer = sync_optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                    optimizer, replicas_to_aggregate=aggregate, total_num_replicas=trainers
                )
            loss_fn, var_list = resolve_loss(config, schema), trainable_variables(model, tables)

            def one_step():
                features, labels = iterator.get_next()
                fed = model if isinstance(features, dict) else on_rows  # whole rows when the share fits in memory
                return _loss_and_train_op(fed, features, labels, loss_fn=loss_fn, optimizer=optimizer,
                                          global_step=global_step, var_list=var_list, task=task, devices=devices)

            chain_length, fixed = _steps_per_call(config, len(devices))
            single = chain_steps(1, one_step, global_step)
            chain = chain_steps(chain_length, one_step, global_step) if chain_length > 1 else None
            variables = checkpoint_variables(model, tables)
            kept, single, chain = _kept_on_task(variables, task, single, chain) if keep else (None, single, chain)
        nan_policy = NanPolicy(config.on_nan)
        # Saving and restoring run on this task, so only the chief needs the run directory.
        with tf.device(task.device):
            saver = FiniteSaver(variables, nan_policy, max_to_keep=KEEP_CHECKPOINTS, save_relative_paths=True)
            # Only the chief checks and restores; the session restores the run's own checkpoint.
            start = starting_point(config, model, resume_from) if task.is_chief else None
            init_fn = _warm_start(start, variables) if start else None
        scaffold = tf.compat.v1.train.Scaffold(saver=saver, init_fn=init_fn)

        if task.is_chief:
            log(f"airflow-tf variables {placement(variables)}")
        # A model of one input of n floats is fed the in-memory share's rows whole, or by feature.
        spec = dataset.element_spec
        fed_rows = not isinstance(spec[0] if isinstance(spec, tuple) else spec, dict)
        log(_start_line(config, task, aggregate=aggregate, towers=len(devices), target=target, kept=kept is not None,
                        fed_rows=fed_rows, start=start))

        calls = StepsPerCall(single, chain, target=target, trainers=trainers, fixed=fixed)
        bound = StepBoundHook(global_step, config.operation_timeout_secs,
                              waits_on={f"ps:{i}": address for i, address in enumerate(task.cluster.get("ps", []))})
        saver.step_bound = bound
        bound.steps_of = lambda fetches: calls.by_op[fetches].steps if fetches in calls.by_op else 1
        progress: ProgressReport | None = None
        tf_config = session_config(task, config)
        if tables:
            _no_constant_folding(tf_config)
        if task.is_chief:
            progress = ProgressReport(target=target, examples_per_step=examples_per_step, run_dir=config.run_dir,
                                every_secs=config.log_every_secs, summary_every_steps=config.summary_every_steps,
                                learning_rate=config.learning_rate, stalls=lambda: bound.stalls)
        training = _training_hook(config, global_step, target, calls, nan_policy=nan_policy, saver=saver,
                                  progress=progress)
        hooks = ([PullHook(kept)] if kept is not None else []) + _hooks(task, bound, training, sync_optimizer)

        session = _open_session(_session_creator(config, task, scaffold, server.target, tf_config), hooks, task,
                                resume_from)
        _run_to_target(session, training, config, task)
        tf.compat.v1.summary.FileWriterCache.clear()  # closes the event files

    return task_result(task, training.last_step, nan_policy, progress, config.run_dir)


def _kept_on_task(variables: dict, task: Task, single, chain):
    """A sole trainer keeps copies of its variables on itself, pushed to the ps by each step:
    the copies join the checkpoint's variables; returns them and the pushing step ops."""
    kept = KeptVariables({name: v for name, v in variables.items() if on_task(v, task.device)})
    variables.update(kept.copies)
    return kept, kept.pushing(single), chain and kept.pushing(chain)


def _training_hook(config: TrainingConfig, global_step, target: int, calls: StepsPerCall, *, nan_policy: NanPolicy,
                   saver: FiniteSaver, progress: ProgressReport | None) -> TrainingHook:
    """The hook that runs the steps; the chief's (the one with ``progress``) also saves and reports."""
    return TrainingHook(
        global_step, target, calls, [nan_policy],  # the NaN policy before the saver: a NaN step is never saved
        saver=tf.compat.v1.train.CheckpointSaverHook(config.run_dir, save_secs=config.checkpoint_every_secs,
                                                     saver=saver) if progress is not None else None,
        reporters=[progress] if progress is not None else [])


def _start_line(config: TrainingConfig, task: Task, *, aggregate: int, towers: int, target: int, kept: bool,
                fed_rows: bool, start: Start | None) -> str:
    """The task's log line saying how it trains."""
    trainers = len(task.trainers)
    return (f"airflow-tf train role={task.type} index={task.index} chief={task.is_chief} "
            f"mode={'sync' if config.sync else 'async'} replicas_to_aggregate={aggregate} "
            f"trainers={trainers} shard={task.trainer_index}/{trainers} towers={towers} target_step={target} "
            f"variables={'kept (copies on the ps)' if kept else 'on the ps'} "
            f"intra_op_threads={intra_op_threads(task, config)} input={'whole_rows' if fed_rows else 'by_feature'} "
            f"start={start or 'from the chief'}")


def _session_creator(config: TrainingConfig, task: Task, scaffold, master: str, tf_config):
    """The chief creates (and restores) the session; the other trainers wait for it."""
    if task.is_chief:
        return tf.compat.v1.train.ChiefSessionCreator(
            scaffold=scaffold, master=master, config=tf_config, checkpoint_dir=config.run_dir
        )
    return WorkerSessionCreator(scaffold, master, tf_config, WORKER_POLL_SECS, WORKER_MAX_WAIT_SECS)


def _open_session(creator, hooks: list, task: Task, resume_from: str | None):
    try:
        return tf.compat.v1.train.MonitoredSession(
            session_creator=QuickCloseCreator(creator), hooks=hooks, stop_grace_period_secs=STOP_GRACE_SECS
        )
    except tf.errors.NotFoundError as exc:
        if not (task.is_chief and resume_from):
            raise
        raise restore_refused(resume_from, exc) from None


def _run_to_target(session, training: TrainingHook, config: TrainingConfig, task: Task) -> None:
    """Run the training steps until the hooks stop the session (the target step reached)."""
    with session:
        while not session.should_stop():
            try:
                session.run(training.next_op())
            except tf.errors.OutOfRangeError as exc:
                # The input repeats forever, so it ends only when this trainer's share holds no
                # record; MonitoredSession would take the end as done and report a success. Other
                # ends (sync mode's token queue closed by the chief at exit) stay its to handle.
                if getattr(exc.op, "type", None) != "IteratorGetNext":
                    raise
                raise DataError(
                    f"the train split of {config.dataset} gave {task.type} {task.index} (share "
                    f"{task.trainer_index + 1} of {len(task.trainers)}) no record: {EMPTY_SHARE_REMEDY}") from None
