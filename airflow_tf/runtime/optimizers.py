"""The optimizers, by the names users give (``optimizer=``, :data:`airflow_tf.cluster.training.OPTIMIZERS`):
TensorFlow's for between-graph training (:data:`GRAPH_OPTIMIZERS`), Keras's for coordinator mode
(:data:`KERAS_OPTIMIZERS`, which has no ``lazy_adam``: the options refuse it there).

Each applies an embedding table's gradient (``IndexedSlices``: the rows a step looked up) as a
sparse update on the ps that holds the rows. What each does to a table per step:

- ``sgd``: subtracts the rows' gradients; no state.
- ``adagrad``: adds the rows' squared gradients to their accumulator and scales by it.
- ``ftrl``: FTRL-Proximal on the looked-up rows (two slots: accumulator and linear term).
- ``lazy_adam``: Adam's moments of the looked-up rows only; rows not looked up keep their
  moments as they are, so a step costs the rows it touched.
- ``adam``: TensorFlow's Adam: every row's moments decay every step (work proportional to the
  whole table, on the ps), the looked-up rows get their gradient added.
- ``rmsprop``: TensorFlow's RMSProp (sparse updates of the looked-up rows)."""

from __future__ import annotations

import keras
import tensorflow as tf

from airflow_tf.cluster.training import TrainingConfig


class LazyAdamOptimizer(tf.compat.v1.train.AdamOptimizer):
    """Adam whose sparse update reads and writes the moments of the updated rows only."""

    def _resource_apply_sparse(self, grad, var, indices):
        dtype = var.dtype.base_dtype
        beta1_power, beta2_power = (tf.cast(p, dtype) for p in self._get_beta_accumulators())
        lr, beta1, beta2, epsilon = (tf.cast(t, dtype) for t in
                                     (self._lr_t, self._beta1_t, self._beta2_t, self._epsilon_t))
        step_size = lr * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        m_rows = beta1 * tf.gather(m, indices) + (1 - beta1) * grad
        v_rows = beta2 * tf.gather(v, indices) + (1 - beta2) * tf.square(grad)
        m_update = m.scatter_update(tf.IndexedSlices(m_rows, indices))
        v_update = v.scatter_update(tf.IndexedSlices(v_rows, indices))
        var_update = var.scatter_sub(tf.IndexedSlices(step_size * m_rows / (tf.sqrt(v_rows) + epsilon), indices))
        return tf.group(var_update, m_update, v_update)


def _filled(value: float):
    """An initializer that fills its shape with ``value`` by a ``Fill`` op. TensorFlow's
    ``constant_initializer`` makes a ``Const`` node whose kernel keeps the whole tensor for the
    life of the process: one more table-sized copy on the ps for every accumulator."""

    def initializer(shape, dtype=tf.float32, partition_info=None):
        return tf.fill(shape, tf.constant(value, dtype=dtype))

    return initializer


class AdagradOptimizer(tf.compat.v1.train.AdagradOptimizer):
    """TensorFlow's Adagrad, its accumulators initialised without a kept constant."""

    def _create_slots(self, var_list):
        for v in var_list:
            self._get_or_make_slot_with_initializer(v, _filled(self._initial_accumulator_value), v.get_shape(),
                                                    v.dtype.base_dtype, "accumulator", self._name)


class FtrlOptimizer(tf.compat.v1.train.FtrlOptimizer):
    """TensorFlow's FTRL, its accumulators initialised without a kept constant."""

    def _create_slots(self, var_list):
        for v in var_list:
            self._get_or_make_slot_with_initializer(v, _filled(self._initial_accumulator_value), v.shape, v.dtype,
                                                    "accum", self._accum_name or self._name)
            self._zeros_slot(v, "linear", self._linear_name or self._name)


GRAPH_OPTIMIZERS = {
    "sgd": tf.compat.v1.train.GradientDescentOptimizer,
    "adam": tf.compat.v1.train.AdamOptimizer,
    "lazy_adam": LazyAdamOptimizer,
    "adagrad": AdagradOptimizer,
    "ftrl": FtrlOptimizer,
    "rmsprop": tf.compat.v1.train.RMSPropOptimizer,
}


KERAS_OPTIMIZERS = {
    "sgd": keras.optimizers.SGD,
    "adam": keras.optimizers.Adam,
    "adagrad": keras.optimizers.Adagrad,
    "ftrl": keras.optimizers.Ftrl,
    "rmsprop": keras.optimizers.RMSprop,
}


def make_optimizer(config: TrainingConfig):
    """The run's optimizer, from its mode's table: TensorFlow's in between-graph training, Keras's
    in coordinator mode (built under the strategy's scope)."""
    if config.mode == "coordinator":
        return KERAS_OPTIMIZERS[config.optimizer](learning_rate=config.learning_rate)
    return GRAPH_OPTIMIZERS[config.optimizer](config.learning_rate)
