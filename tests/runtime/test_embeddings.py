"""Embedding tables on the parameter servers: a plain Keras click model (``Hashing`` ->
``Embedding`` on two string ids) gets its tables split over the ps tasks and its lookups run
there; the checkpoint holds each table whole; evaluation and export see an ordinary model; a
run resumed with another ps count restores its own slices; tables too big for a ps are refused
before training; lazy Adam touches only the rows a step looked up.

The graph tests build the training graph for a two-ps cluster without starting it (placement is
decided when the graph is built); the group tests run real ps and worker processes."""

from __future__ import annotations

import re
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from serving_check import export_and_serve_elsewhere

from airflow_tf.cluster import TrainingConfig
from airflow_tf.cluster.model_code import snapshot_model_code
from airflow_tf.data import load_schema, prepare_dataset
from airflow_tf.data.samples import write_clicks_csv
from airflow_tf.runtime import models
from airflow_tf.runtime.embeddings import check_ps_memory, slice_count, slice_embeddings, slice_rows
from airflow_tf.runtime.errors import TaskConfigError
from airflow_tf.runtime.optimizers import LazyAdamOptimizer
from airflow_tf.runtime.training import checkpoint_variables

CLICK_MODEL = '''
import keras


def build(rows=4096, dim=8):
    user = keras.Input((), dtype="string", name="user")
    item = keras.Input((), dtype="string", name="item")
    u = keras.layers.Embedding(rows, dim)(keras.layers.Hashing(rows)(user))
    i = keras.layers.Embedding(rows, dim)(keras.layers.Hashing(rows)(item))
    x = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([u, i]))
    return keras.Model({"user": user, "item": item}, keras.layers.Dense(1, activation="sigmoid")(x))
'''
CLUSTER = {"ps": ["ps0:2222", "ps1:2222"], "worker": ["w0:2222"]}


def click_model(rows=4096, dim=8):
    namespace: dict = {}
    exec(CLICK_MODEL, namespace)  # the user's module, as text: the same source the group tests snapshot
    return namespace["build"](rows, dim)


def build_training_graph(rows=4096, dim=8, min_slice_bytes=1024, sliced=True):
    """The click model's forward and Adagrad update in a graph placed for CLUSTER, as a worker builds it."""
    graph = tf.Graph()
    with graph.as_default():
        setter = tf.compat.v1.train.replica_device_setter(cluster=tf.train.ClusterSpec(CLUSTER),
                                                          worker_device="/job:worker/task:0")
        with tf.compat.v1.device(setter):
            global_step = tf.compat.v1.train.get_or_create_global_step()
            model = click_model(rows, dim)
            keys = {id(w.value): models.weight_key(i, w) for i, w in enumerate(model.weights)}
            tables = slice_embeddings(model, keys, 2, min_slice_bytes) if sliced else []
            features = {"user": tf.constant(["u1", "u2"]), "item": tf.constant(["i1", "i2"])}
            loss = tf.reduce_mean(model(features, training=True))
            variables = [v for t in tables for v in t.slices] + [
                w.value for w in model.trainable_weights if all(w.value is not t.shadow for t in tables)]
            optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
            grads = optimizer.compute_gradients(loss, var_list=variables)
            optimizer.apply_gradients(grads, global_step=global_step)
    return graph, model, tables, grads


def test_slices_follow_the_table_size_and_the_ps_count():
    assert slice_count(64 * 2**20, ps_tasks=4, min_slice_bytes=16 * 2**20) == 4
    assert slice_count(2 * 2**30, ps_tasks=4, min_slice_bytes=16 * 2**20) == 4  # 2 GB over 4 ps: ~0.5 GB each
    assert slice_count(20 * 2**20, ps_tasks=4, min_slice_bytes=16 * 2**20) == 2
    assert slice_count(1024, ps_tasks=4, min_slice_bytes=16 * 2**20) == 1
    # Past max_slice_bytes per ps, several slices per ps, as many on each: 2 GB over 4 ps in 128 MB slices.
    assert slice_count(2 * 2**30, ps_tasks=4, min_slice_bytes=16 * 2**20, max_slice_bytes=128 * 2**20) == 16
    assert slice_count(512 * 2**20, ps_tasks=3, min_slice_bytes=16 * 2**20, max_slice_bytes=128 * 2**20) == 6
    assert slice_count(256 * 2**20, ps_tasks=2, min_slice_bytes=16 * 2**20, max_slice_bytes=128 * 2**20) == 2
    assert slice_rows(10, 3) == [4, 3, 3] and sum(slice_rows(4_194_304, 3)) == 4_194_304


def test_lookups_run_on_the_ps_and_no_table_is_read_whole_on_the_worker():
    graph, _, tables, grads = build_training_graph()
    assert len(tables) == 2
    for table in tables:
        assert sorted(s.device for s in table.slices) == ["/job:ps/task:0", "/job:ps/task:1"]
    slice_names = {s.op.name for t in tables for s in t.slices}
    gathers = [op for op in graph.get_operations() if op.type == "ResourceGather"
               and op.inputs[0].op.name in slice_names]
    assert len(gathers) == 4, "one lookup per slice of each table"
    for op in gathers:
        assert op.device == op.inputs[0].op.device and op.device.startswith("/job:ps/"), (op.name, op.device)
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp" and op.inputs[0].op.name in slice_names]
    leaving = [(read.name, consumer.name, consumer.device) for read in reads for consumer in read.outputs[0].consumers()
               if consumer.device != read.inputs[0].op.device]
    assert leaving == [], f"a table slice is read whole off its ps: {leaving}"
    for grad, variable in grads:
        if variable.op.name in slice_names:
            assert isinstance(grad, tf.IndexedSlices), "a table's gradient is its looked-up rows only"
    sparse_updates = [op for op in graph.get_operations() if op.type == "ResourceSparseApplyAdagrad"]
    assert len(sparse_updates) == 4 and all(op.device.startswith("/job:ps/") for op in sparse_updates)


def test_without_the_ps_lookup_keras_reads_the_whole_table_onto_the_worker():
    """What the lookup above replaces (and what the test above would see without it)."""
    graph, model, _, _ = build_training_graph(sliced=False)
    tables = {layer.embeddings.value.op.name for layer in model.layers if isinstance(layer, keras.layers.Embedding)}
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp" and op.inputs[0].op.name in tables]
    gathers = [op for op in graph.get_operations() if op.type == "GatherV2" and op.inputs[0].op in reads]
    assert reads and gathers and all(op.device.startswith("/job:worker") for op in gathers)


def test_the_checkpoint_names_each_table_once_whatever_its_slice_count():
    graph, model, tables, _ = build_training_graph()
    with graph.as_default():
        named = checkpoint_variables(model, tables)
    assert [len(named[key]) for key in ("model/000_embeddings", "model/001_embeddings")] == [2, 2]
    assert len(named["model/000_embeddings/Adagrad"]) == 2, "the optimizer slot is saved as one tensor too"
    assert not any("part_" in key for key in named)


def test_tables_that_would_not_fit_on_a_ps_are_refused_with_the_numbers():
    graph, _, tables, _ = build_training_graph(rows=4096, dim=8)
    with pytest.raises(TaskConfigError) as refused:
        check_ps_memory(tables, "adagrad", 2, budget_bytes=100_000)
    message = str(refused.value)
    assert "4,096 rows x 8 x 4 bytes" in message and "2 slice(s)" in message and "2 ps" in message
    assert "ps_memory_limit" in message and "Add ps tasks" in message
    check_ps_memory(tables, "adagrad", 2, budget_bytes=10**9)  # fits: nothing raised


def test_lazy_adam_updates_only_the_rows_looked_up():
    graph = tf.Graph()
    with graph.as_default():
        table = tf.Variable(np.ones((6, 2), np.float32))
        rows = tf.nn.embedding_lookup(table, tf.constant([1, 4, 4]))
        loss = tf.reduce_sum(rows * tf.constant([[1.0, 2.0]]))
        lazy = LazyAdamOptimizer(0.1)
        lazy_step = lazy.minimize(loss, var_list=[table])
        m = lazy.get_slot(table, "m")
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                session.run(lazy_step)
            values, moments = session.run([table, m])
    untouched = [0, 2, 3, 5]
    assert np.array_equal(values[untouched], np.ones((4, 2))), "rows not looked up keep their values"
    assert np.array_equal(moments[untouched], np.zeros((4, 2))), "and their moments"
    assert np.all(values[[1, 4]] < 1.0), "looked-up rows move against the gradient"


# -- real groups ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clicks(tmp_path_factory):
    """A small click dataset and the click model's module, snapshotted as the launch does."""
    root = tmp_path_factory.mktemp("clicks")
    csv = write_clicks_csv(root / "clicks.csv", rows=20_000, users=5_000, items=5_000, seed=3)
    dataset = prepare_dataset(csv, root / "datasets", name="clicks", label="clicked", shards=4,
                              string_columns=["user", "item"])["dataset_uri"]
    (root / "code").mkdir()
    (root / "code" / "user_click_model.py").write_text(CLICK_MODEL)
    sys.path.insert(0, str(root / "code"))
    try:
        snapshot = snapshot_model_code("user_click_model:build", str(root / "run"))
    finally:
        sys.path.remove(str(root / "code"))
        sys.modules.pop("user_click_model", None)
    return dataset, root / "run", str(snapshot.path)


def click_options(code_dir, **options):
    return dict(model="user_click_model:build", code_dir=code_dir, loss="binary_crossentropy", optimizer="adagrad",
                min_slice_bytes=1024, batch_size=64, **options)


@pytest.fixture(scope="module")
def sliced_run(clicks, train):
    dataset, run_dir, code_dir = clicks
    return train("rt-emb", dataset, run_dir, ps=2, workers=2, **click_options(code_dir, steps=400))


@pytest.mark.slow
def test_a_plain_keras_click_model_trains_with_its_tables_split_over_every_ps(sliced_run):
    assert sliced_run.succeeded, sliced_run.report
    for worker in ("worker-0", "worker-1"):
        described = sliced_run.lines(worker, "airflow-tf embedding ")
        assert len(described) == 2 and all("4096x8" in line and "2 slice(s) on ps 0,1" in line for line in described)
    (placement,) = sliced_run.lines("worker-0", "airflow-tf variables ")
    held = dict(pair.split("=") for pair in placement.split("airflow-tf variables ")[1].split())
    for ps in ("/job:ps/task:0", "/job:ps/task:1"):
        assert {"model/000_embeddings", "model/001_embeddings"} <= set(held[ps].split(",")), placement
    reader = tf.train.load_checkpoint(models.latest_checkpoint(sliced_run.run_dir))
    shapes = reader.get_variable_to_shape_map()
    assert shapes["model/000_embeddings"] == [4096, 8] and shapes["model/000_embeddings/Adagrad"] == [4096, 8]
    assert len(list(sliced_run.run_dir.glob("model.ckpt-*.data-*-of-00002"))) >= 2, "each ps saves its own part"


@pytest.mark.slow
def test_evaluation_and_the_export_of_a_sliced_model_agree_on_raw_string_ids(sliced_run, clicks, tmp_path):
    from airflow_tf.serving.evaluate import evaluate_checkpoint, evaluate_saved_model
    from airflow_tf.serving.export import export_saved_model

    dataset, run_dir, _ = clicks
    config = sliced_run.config.to_dict()
    evaluation = evaluate_checkpoint(run_dir, dataset, config, thresholds={"auc": {"min": 0.6}})
    assert evaluation["task"] == "binary_classification" and evaluation["blessed"], evaluation
    exported = export_saved_model(run_dir, dataset, config, tmp_path / "serving", "clicks", metrics=evaluation)
    served = evaluate_saved_model(exported["path"], dataset, config)
    assert served["metrics"] == pytest.approx(evaluation["metrics"], rel=1e-5)

    saved = tf.train.load_checkpoint(f"{exported['path']}/variables/variables").get_variable_to_shape_map()
    tables = [name for name, shape in saved.items() if shape == [4096, 8]]
    assert len(tables) == 2, f"each table is one ordinary variable in the SavedModel: {saved}"
    loaded = tf.saved_model.load(exported["path"])
    predict = loaded.signatures["serving_default"]
    users, items = tf.constant(["u1", "u7"]), tf.constant(["i3", "i1"])
    outputs = predict(user=users, item=items)["predictions"].numpy()
    model = models.restore_model(run_dir, TrainingConfig.from_dict(config), load_schema(dataset))
    expected = model({"user": users, "item": items}, training=False).numpy()
    np.testing.assert_allclose(outputs, expected, rtol=1e-5)
    # As TensorFlow Serving loads it, elsewhere, with the run and the dataset gone.
    export_and_serve_elsewhere(run_dir, dataset, config, tmp_path / "served")


@pytest.mark.slow
def test_a_run_resumed_with_another_ps_count_restores_its_own_slices(sliced_run, clicks, train):
    dataset, run_dir, code_dir = clicks
    reader = tf.train.load_checkpoint(models.latest_checkpoint(run_dir))
    before, step = reader.get_tensor("model/000_embeddings"), int(reader.get_tensor("global_step"))
    # Three ps now, and slices of at most 20,000 bytes: each 131,072-byte table is re-split into
    # nine slices, three per ps, and each slice restores its rows.
    resumed = train("rt-emb-3ps", dataset, run_dir, ps=3, workers=1,
                    **click_options(code_dir, steps=step + 20, learning_rate=1e-9, max_slice_bytes=20_000))
    assert resumed.succeeded, resumed.report
    assert resumed.lines("worker-0", f"start=restoring {run_dir}")
    assert all("9 slice(s) on ps 0,1,2,0,1,2,0,1,2" in line
               for line in resumed.lines("worker-0", "airflow-tf embedding "))
    after_reader = tf.train.load_checkpoint(models.latest_checkpoint(run_dir))
    assert int(after_reader.get_tensor("global_step")) >= step + 20
    np.testing.assert_allclose(after_reader.get_tensor("model/000_embeddings"), before, atol=1e-6)


@pytest.mark.slow
def test_a_table_too_big_for_the_ps_fails_before_training_naming_the_sizes(clicks, train, tmp_path):
    dataset, _, code_dir = clicks
    run = train("rt-emb-big", dataset, tmp_path / "run", ps=2, workers=1,
                **click_options(code_dir, steps=100, model_kwargs={"rows": 1_000_000, "dim": 64},
                                ps_memory_limit="600Mi"))
    assert not run.succeeded
    assert "embedding tables do not fit on the parameter servers" in run.report, run.report
    assert "1,000,000 rows x 64 x 4 bytes" in run.report
    assert not list((tmp_path / "run").glob("model.ckpt-*")), "nothing was trained or saved"
    assert not re.search(r"session ready", run.logs["worker-0"])


@pytest.mark.slow
def test_coordinator_mode_refuses_a_table_it_would_read_whole_naming_the_layer(clicks, train, tmp_path):
    dataset, _, code_dir = clicks
    run = train("rt-emb-coord", dataset, tmp_path / "run", ps=2, workers=1, mode="coordinator",
                **click_options(code_dir, steps=50))
    assert not run.succeeded
    assert "embedding layer 'embedding" in run.report and "mode='coordinator'" in run.report, run.report
    assert "mode='between_graph'" in run.report


def test_lazy_adam_in_coordinator_mode_is_refused_before_launch():
    with pytest.raises(ValueError, match="'lazy_adam' updates the embedding rows"):
        TrainingConfig(dataset="d", run_dir="r", steps=1, mode="coordinator", optimizer="lazy_adam")


def test_every_optimizer_the_options_accept_exists_in_each_mode_that_accepts_it():
    from airflow_tf.cluster.training import OPTIMIZERS
    from airflow_tf.runtime.optimizers import GRAPH_OPTIMIZERS, KERAS_OPTIMIZERS

    assert set(GRAPH_OPTIMIZERS) == set(OPTIMIZERS)
    assert set(KERAS_OPTIMIZERS) == set(OPTIMIZERS) - {"lazy_adam"}


VOCABULARY_MODEL = '''
import keras


def build(schema, dim=8):
    user = keras.Input((), dtype="string", name="user")
    item = keras.Input((), dtype="string", name="item")
    user_ids, item_ids = schema.vocabulary("user"), schema.vocabulary("item")
    u = keras.layers.Embedding(len(user_ids) + 1, dim)(keras.layers.StringLookup(vocabulary=user_ids)(user))
    i = keras.layers.Embedding(len(item_ids) + 1, dim)(keras.layers.StringLookup(vocabulary=item_ids)(item))
    x = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([u, i]))
    return keras.Model({"user": user, "item": item}, keras.layers.Dense(1, activation="sigmoid")(x))
'''


@pytest.mark.slow
def test_a_model_built_on_the_datasets_vocabularies_trains_on_the_ps_and_exports(train, tmp_path):
    from airflow_tf.serving.evaluate import evaluate_checkpoint, evaluate_saved_model
    from airflow_tf.serving.export import export_saved_model

    csv = write_clicks_csv(tmp_path / "clicks.csv", rows=20_000, users=3_000, items=2_000, seed=4)
    dataset = prepare_dataset(csv, tmp_path / "datasets", name="clicks", label="clicked", shards=4,
                              string_columns=["user", "item"],
                              vocabularies={"user": 1_000, "item": 500})["dataset_uri"]
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "vocab_click_model.py").write_text(VOCABULARY_MODEL)
    sys.path.insert(0, str(tmp_path / "code"))
    try:
        code_dir = str(snapshot_model_code("vocab_click_model:build", str(tmp_path / "run")).path)
    finally:
        sys.path.remove(str(tmp_path / "code"))
        sys.modules.pop("vocab_click_model", None)
    run = train("rt-emb-vocab", dataset, tmp_path / "run", ps=2, workers=2,
                **{**click_options(code_dir, steps=300), "model": "vocab_click_model:build"})
    assert run.succeeded, run.report
    described = run.lines("worker-0", "airflow-tf embedding ")
    assert any("1001x8" in line for line in described) and any("501x8" in line for line in described), described
    config = run.config.to_dict()
    evaluation = evaluate_checkpoint(tmp_path / "run", dataset, config)
    exported = export_saved_model(tmp_path / "run", dataset, config, tmp_path / "serving", "clicks",
                                  metrics=evaluation, force=True)
    served = evaluate_saved_model(exported["path"], dataset, config)
    assert served["metrics"] == pytest.approx(evaluation["metrics"], rel=1e-5)
