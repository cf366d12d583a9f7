"""Embedding tables on the parameter servers, for between-graph training.

A plain ``keras.layers.Embedding`` reads its whole table and gathers on the worker: every step
moves the entire table from the ps, and the table lives whole on one ps. Here every such layer
of a user's model gets, after the model is built:

- its table split row-wise into slices over the ps tasks (one per ``min_slice_bytes`` of it
  up to one per ps; more, several per ps, when that would make a slice larger than
  ``max_slice_bytes``), each slice created and initialised on its ps (the initial values never
  travel);
- a ``call`` that looks the ids up with ``tf.nn.embedding_lookup`` on the slices, so the
  gather runs on each ps and only the looked-up rows travel; the gradient is ``IndexedSlices``
  and the optimizer applies it as a sparse update on the ps.

The layer's own variable stays in the model (so the model's weights keep their positions and
shapes, which name the checkpoint: :func:`airflow_tf.runtime.models.weight_key`) but is never
initialised, read or saved: it costs no memory. The slices carry TensorFlow's save-slice
information under the weight's checkpoint name, so a checkpoint holds each table (and each of
its optimizer slots) as one tensor whatever the slice count: evaluation and export read it as
an ordinary variable, and a run resumed with another ps count restores its own slices of it."""

from __future__ import annotations

import math
import os
import types
from dataclasses import dataclass

import keras
import tensorflow as tf

from airflow_tf.cluster.memory import TASK_BASELINE_BYTES, mem_available_bytes, memory_bytes

from .errors import TaskConfigError
from .logs import log


@dataclass
class SlicedTable:
    """One embedding table split over the ps tasks."""

    layer: keras.layers.Embedding
    key: str
    """Checkpoint name of the table (the layer weight's position-based name)."""
    shadow: tf.Variable
    """The layer's own full-size variable: kept for the model's structure, never initialised."""
    slices: list[tf.Variable]

    @property
    def rows(self) -> int:
        return int(self.shadow.shape[0])

    @property
    def dim(self) -> int:
        return int(self.shadow.shape[1])

    @property
    def nbytes(self) -> int:
        return self.rows * self.dim * self.shadow.dtype.size

    def describe(self) -> str:
        devices = ",".join(str(tf.DeviceSpec.from_string(s.device).task) for s in self.slices)
        return f"{self.layer.name} {self.rows}x{self.dim} {_mib(self.nbytes)} in {len(self.slices)} slice(s) on ps {devices}"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


def slice_count(table_bytes: int, ps_tasks: int, min_slice_bytes: int, max_slice_bytes: int | None = None) -> int:
    """Slices of a table: one per ``min_slice_bytes`` of it, at least 1, at most one per ps;
    unless a slice would then be larger than ``max_slice_bytes``: then enough slices of at most
    that size, rounded up to a multiple of the ps count so every ps holds as many."""
    count = max(1, min(ps_tasks, math.ceil(table_bytes / max(1, min_slice_bytes))))
    if max_slice_bytes is None or table_bytes <= count * max_slice_bytes:
        return count
    needed = math.ceil(table_bytes / max(1, max_slice_bytes))
    return math.ceil(needed / ps_tasks) * ps_tasks


def slice_rows(rows: int, slices: int) -> list[int]:
    """Rows of each slice in ``tf.nn.embedding_lookup``'s "div" layout: contiguous blocks, the
    first ``rows % slices`` one row longer."""
    return [rows // slices + (1 if i < rows % slices else 0) for i in range(slices)]


def _plain_embeddings(model: keras.Model) -> list[keras.layers.Embedding]:
    """The model's Embedding layers (nested ones too) that look up exactly as Keras's own does;
    others (a subclass with its own ``call``, a quantized or LoRA table) keep Keras's path."""
    found = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if not isinstance(layer, keras.layers.Embedding):
            continue
        if type(layer).call is not keras.layers.Embedding.call or layer.quantization_mode or layer.lora_enabled:
            log(f"airflow-tf embedding {layer.name}: {type(layer).__name__} has its own lookup (or is quantized/LoRA); "
                "its table stays whole on one ps and is read whole on the worker every step")
            continue
        found.append(layer)
    return found


def _lookup(table: SlicedTable):
    def call(layer, inputs):
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int64)
        return tf.cast(tf.nn.embedding_lookup(table.slices, inputs), layer.compute_dtype)

    return call


def slice_embeddings(model: keras.Model, keys: dict[int, str], ps_tasks: int, min_slice_bytes: int,
                     max_slice_bytes: int | None = None) -> list[SlicedTable]:
    """Give every plain Embedding layer of ``model`` (built in the current graph) sliced storage
    on the ps tasks and a lookup that runs there; ``keys`` maps ``id`` of a weight's variable to
    its checkpoint name. Call inside the training graph, before the model is called."""
    tables = []
    next_ps = 0  # tables with fewer slices than ps tasks are spread round the ps tasks
    global_variables = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    trainable_variables = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    for layer in _plain_embeddings(model):
        shadow = layer.embeddings.value
        key = keys[id(shadow)]
        rows, dim = (int(d) for d in shadow.shape)
        count = slice_count(rows * dim * shadow.dtype.size, ps_tasks, min_slice_bytes, max_slice_bytes)
        slices, offset = [], 0
        for i, part_rows in enumerate(slice_rows(rows, count)):
            with tf.compat.v1.device(f"/job:ps/task:{(next_ps + i) % ps_tasks}"):
                # A tensor built here (not a callable) keeps the initializer on the ps.
                initial = layer.embeddings_initializer((part_rows, dim), dtype=shadow.dtype.name)
                piece = tf.Variable(initial, name=f"{layer.name}/embeddings/part_{i}", dtype=shadow.dtype)
            piece._set_save_slice_info(tf.Variable.SaveSliceInfo(key, [rows, dim], [offset, 0], [part_rows, dim]))
            offset += part_rows
            slices.append(piece)
        next_ps = (next_ps + count) % ps_tasks
        for collection in (global_variables, trainable_variables):
            if shadow in collection:
                collection.remove(shadow)
        table = SlicedTable(layer, key, shadow, slices)
        layer.call = types.MethodType(_lookup(table), layer)
        tables.append(table)
        log(f"airflow-tf embedding {table.describe()}")
    return tables


def trainable_variables(model: keras.Model, tables: list[SlicedTable]) -> list[tf.Variable]:
    """What the optimizer updates: the model's trainable weights, each sliced table as its slices."""
    sliced = {id(t.shadow): t.slices for t in tables}
    variables: list[tf.Variable] = []
    for weight in model.trainable_weights:
        variables.extend(sliced.get(id(weight.value), [weight.value]))
    return variables


# Optimizer state per table row, by optimizer name: how many table-sized slots it keeps.
SLOTS_PER_TABLE = {"sgd": 0, "adagrad": 1, "adam": 2, "lazy_adam": 2, "ftrl": 2, "rmsprop": 2}


def check_ps_memory(tables: list[SlicedTable], optimizer: str, ps_tasks: int, budget_bytes: int | None) -> None:
    """Refuse tables whose slices and optimizer slots would not fit in one ps's ``budget_bytes``
    at its peak (while a checkpoint is written), with the numbers, before any of them is
    allocated (instead of an OOM kill halfway)."""
    if budget_bytes is None or not tables:
        return
    copies = 1 + SLOTS_PER_TABLE.get(optimizer, 2)
    per_ps = [0] * ps_tasks
    largest = [0] * ps_tasks
    for table in tables:
        for piece in table.slices:
            task = tf.DeviceSpec.from_string(piece.device).task or 0
            nbytes = int(piece.shape[0]) * table.dim * table.shadow.dtype.size
            per_ps[task] += nbytes * copies
            largest[task] = max(largest[task], nbytes)
    # A checkpoint save reads one variable of a ps at a time (saving.py); a sparse update to the
    # variable being written copies it: a ps holds its part plus its largest slice.
    per_ps = [held + extra for held, extra in zip(per_ps, largest, strict=True)]
    fullest = max(range(ps_tasks), key=per_ps.__getitem__)
    if per_ps[fullest] <= budget_bytes:
        return
    tables_text = "; ".join(
        f"{t.layer.name}: {t.rows:,} rows x {t.dim} x {t.shadow.dtype.size} bytes = {_mib(t.nbytes)} in "
        f"{len(t.slices)} slice(s)" for t in tables)
    raise TaskConfigError(
        f"the embedding tables do not fit on the parameter servers: ps {fullest} would hold "
        f"{_mib(per_ps[fullest])} (tables x {copies} for the table and its {optimizer} slots, plus its largest "
        f"slice while a checkpoint is written) but has "
        f"{_mib(budget_bytes)} for them ({tables_text}; {ps_tasks} ps). Add ps tasks (tables are split over "
        "all of them), give the ps more memory (ps_memory_limit), lower min_slice_bytes so small tables split "
        "too (max_slice_bytes so large ones split finer), or use fewer rows or dimensions"
    )


def ps_table_budget(ps_memory_limit: str | None, ps_tasks: int) -> int | None:
    """Bytes one ps may give its tables and their slots: its memory limit less what a task
    takes before its variables; without a limit, on a local group (every ps on this machine),
    an equal share of the memory available now; on a cluster without a limit, None (unchecked)."""
    if ps_memory_limit is not None:
        return max(0, memory_bytes(ps_memory_limit) - TASK_BASELINE_BYTES)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    available = mem_available_bytes()
    return None if available is None else available // max(1, ps_tasks)



def refuse_sliced_tables_in_coordinator_mode(model: keras.Model, min_slice_bytes: int) -> None:
    """Coordinator mode keeps Keras's own lookup (the table read whole every step): a table large
    enough to be split over the ps is refused, naming the layer; a smaller one is logged."""
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if not isinstance(layer, keras.layers.Embedding):
            continue
        rows, dim = (int(d) for d in layer.embeddings.shape)
        nbytes = rows * dim * layer.embeddings.value.dtype.size
        if nbytes >= min_slice_bytes:
            raise TaskConfigError(
                f"embedding layer {layer.name!r} ({rows:,} x {dim}, {_mib(nbytes)}): mode='coordinator' cannot look "
                "rows up on the parameter servers (Keras 3's optimizers update a table under ParameterServerStrategy "
                "whole, so every step would read and write all of it); use mode='between_graph' (the default), "
                f"where the table is split over the ps tasks and only looked-up rows travel, or a table under "
                f"min_slice_bytes={min_slice_bytes:,}"
            )
        log(f"airflow-tf embedding {layer.name} {rows}x{dim} {_mib(nbytes)}: coordinator mode reads it whole every "
            "step (mode='between_graph' looks rows up on the ps)")
