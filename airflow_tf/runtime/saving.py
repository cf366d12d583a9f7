"""Checkpoint writes that cost a parameter server one variable's memory, not all of its variables'.

Once a sparse op (an embedding lookup or update) has touched a resource variable, TensorFlow
keeps it in "copy-on-read" mode: every plain read copies the whole variable. The Saver's own
"read without copy" does not help in a TF1 graph, because nothing orders its
``DisableCopyOnRead`` before the read. And one ``SaveV2`` per ps reads all of the ps's variables
before it writes any of them. Together, a save held a second copy of every table and slot: a
ps of 1 GiB of tables peaked at 2 GiB at each checkpoint.

Here a save reads each variable without a copy (``DisableCopyOnRead`` first), and writes the
large variables of a ps one after another, each in its own ``SaveV2`` whose read waits for the
previous write. A sparse update that reaches the variable being written still copies it (the
write holds the old buffer); that is one variable, and tables are split into slices of at most
``max_slice_bytes`` (embeddings.py) so that one is small. The checkpoint is an ordinary sharded
V2 checkpoint (one data file per group), read by every TensorFlow checkpoint reader."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.training import saver as saver_lib  # the Saver's builder hook has no public alias

LARGE_VARIABLE_BYTES = 4 * 2**20
"""A variable at least this large is written on its own; smaller ones together, after them."""


def read_without_copy(handle: tf.Tensor, dtype: tf.DType, device: str) -> tf.Tensor:
    """The value of the resource variable behind ``handle`` as a tensor that shares its buffer
    (no copy, even in copy-on-read mode)."""
    with tf.device(device):
        disable = tf.raw_ops.DisableCopyOnRead(resource=handle)
        with tf.control_dependencies([disable]):
            return tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)


def _variable_handle(saveable) -> tf.Tensor | None:
    """The handle of the resource variable a saveable writes in one spec, or None for any other saveable."""
    handle = getattr(saveable, "handle_op", None)
    if len(saveable.specs) != 1 or not isinstance(handle, tf.Tensor) or handle.op.type != "VarHandleOp":
        return None
    return handle


def _variable_bytes(handle: tf.Tensor) -> int:
    """Bytes of the variable behind a ``VarHandleOp``; 0 when its shape is not fully defined."""
    shape = tf.TensorShape(handle.op.get_attr("shape"))
    dtype = tf.as_dtype(handle.op.get_attr("dtype"))
    return int(shape.num_elements()) * dtype.size if shape.is_fully_defined() else 0


class OneAtATimeSaverBuilder(saver_lib.BulkSaverBuilder):
    """Writes each large variable of a device in its own ``SaveV2``, one after another, read
    without a copy. Use with ``Saver(..., sharded=True)``."""

    def __init__(self):
        super().__init__()
        self._last_write: dict[str, tf.Operation] = {}

    def _GroupByDevices(self, saveables):  # TensorFlow's method name
        groups = []
        for device, on_device in super()._GroupByDevices(saveables):
            small = []
            for saveable in on_device:
                handle = _variable_handle(saveable)
                if handle is not None and _variable_bytes(handle) >= LARGE_VARIABLE_BYTES:
                    groups.append((device, [saveable]))
                else:
                    small.append(saveable)
            if small:
                groups.append((device, small))
        return groups

    def _AddSaveOps(self, filename_tensor, saveables):  # TensorFlow's method name
        device = saveables[0].specs[0].device
        previous = self._last_write.get(device)
        # The reads are made inside save_op, so they wait for the previous write too.
        with tf.control_dependencies([previous] if previous is not None else []):
            write = self.save_op(filename_tensor, saveables)
        self._last_write[device] = write
        with tf.control_dependencies([write]):
            return tf.identity(filename_tensor)

    def save_op(self, filename_tensor, saveables):
        names, tensors, slices = [], [], []
        for saveable in saveables:
            handle = _variable_handle(saveable)
            for spec in saveable.specs:
                names.append(spec.name)
                tensors.append(spec.tensor if handle is None else read_without_copy(handle, spec.dtype, spec.device))
                slices.append(spec.slice_spec)
        return tf.raw_ops.SaveV2(prefix=filename_tensor, tensor_names=names, shape_and_slices=slices,
                                 tensors=tensors)


def all_finite(variables: list[tf.Variable]) -> tf.Tensor:
    """A boolean: every floating-point variable holds finite values only. Each is checked where it
    lives (one boolean travels, not the table), read without a copy, one variable after another
    on each device (so a check holds at most one variable's buffer at a time)."""
    checks: list[tf.Tensor] = []
    last: dict[str, tf.Tensor] = {}
    for variable in variables:
        if not variable.dtype.base_dtype.is_floating:
            continue
        previous = last.get(variable.device)
        with tf.control_dependencies([previous] if previous is not None else []), tf.device(variable.device):
            value = read_without_copy(variable.handle, variable.dtype, variable.device)
            check = tf.reduce_all(tf.math.is_finite(value))
        last[variable.device] = check
        checks.append(check)
    return tf.reduce_all(tf.stack(checks) if checks else tf.constant([True]))
