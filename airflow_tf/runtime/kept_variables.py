"""A sole trainer keeps the variables it trains, the ps holding their copies.

With one trainer training asynchronously, no other task writes the variables between its steps,
so reading every variable from the ps at each step and pushing each step's update back is pure
cost (about 2.5 ms of a small model's 17 ms step on two cores). Such a trainer keeps the model's
variables and the optimizer's state on its own device instead, and each ps keeps a copy of its
share (placed round robin, as the variables would be) under the checkpoint's names:

- every call (one step, or a chain of them) ends by pushing the variables to their copies, so
  the copies are the state after the call's last step whenever a checkpoint is taken;
- the checkpoint is saved from, and restored into, the copies;
- whenever the session starts (a fresh start, a restore, a warm start, a ps replaced), the
  trainer pulls the copies back before its first step.

The global step stays on the ps, and so do the slices of embedding tables split over the ps (a
step updates the rows it looked up there). With several trainers, several towers or synchronous
updates every variable stays on the ps (:func:`keeps_variables`)."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from airflow_tf.cluster.training import TrainingConfig

from .steps import Call


def keeps_variables(config: TrainingConfig, trainers: int, towers: int) -> bool:
    """Whether this trainer keeps its variables (``variable_placement``)."""
    return config.variable_placement == "auto" and trainers == 1 and towers == 1 and not config.sync


def on_task(variable, device: str) -> bool:
    """Whether ``variable`` (a sliced table's slices: a list) lives on the task ``device`` names."""
    if isinstance(variable, list):
        return False
    placed, task = tf.DeviceSpec.from_string(variable.device), tf.DeviceSpec.from_string(device)
    return (placed.job, placed.task) == (task.job, task.task)


def move_to_local(variables) -> None:
    """Make ``variables`` local to this trainer's session: initialised by each session's local
    init (then overwritten by the pull), never saved or waited for as global state."""
    graph = tf.compat.v1.get_default_graph()
    global_ = graph.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    for variable in variables:
        global_.remove(variable)
        graph.add_to_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES, variable)


class KeptVariables:
    """The copies on the ps of a trainer's variables (``named``: checkpoint name -> variable on
    this trainer), created under the caller's device scope (the ps round robin), and the ops
    that push to and pull from them."""

    def __init__(self, named: dict[str, tf.Variable]):
        self.copies: dict[str, tf.Variable] = {}
        for name, variable in named.items():
            # Initialised like the variable (a fresh draw of its initializer): the first pull
            # then gives the trainer a start as the model defines it.
            self.copies[name] = tf.compat.v1.Variable(variable.initial_value, trainable=False,
                                                      name=f"kept/{name.replace('/', '_')}")
        move_to_local(named.values())
        pairs = [(self.copies[name], variable) for name, variable in named.items()]
        self.pull = tf.group(*(variable.assign(copy.read_value()) for copy, variable in pairs),
                             name="pull_kept_variables")
        self._pairs = pairs

    def pushing(self, call: Call) -> Call:
        """``call``, its train op followed by every variable's value copied to the ps (its losses
        and step come from its steps, which the push does not change)."""
        with tf.control_dependencies([call.train_op]):
            push = tf.group(*(copy.assign(variable.read_value()) for copy, variable in self._pairs))
        return dataclasses.replace(call, train_op=push)


class PullHook(tf.compat.v1.train.SessionRunHook):
    """Runs the pull whenever a session starts, before any other hook's start and any step."""

    def __init__(self, kept: KeptVariables):
        self._pull = kept.pull

    def after_create_session(self, session, coord):
        session.run(self._pull)
