"""A checkpoint save costs a parameter server at most one variable's memory over what it holds.

Once a sparse op has touched a variable, TensorFlow copies it on every plain read, and the
plain Saver reads every variable of a task before writing: a ps of embedding tables peaked at
twice its tables at each checkpoint. Each saver is measured in a fresh process (its peak
resident memory, reset before the save through ``/proc/self/clear_refs``): a 64 MiB and a
16 MiB variable, touched by a lookup and a sparse update before the save."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

SAVE_PEAK = r'''
import json, os, sys
import tensorflow as tf
from airflow_tf.runtime.saving import OneAtATimeSaverBuilder

tf.compat.v1.disable_eager_execution()
MIB = 2**20
rows, dim = 2**20, 16  # 64 MiB of float32
table = tf.Variable(tf.zeros([rows, dim]), name="table")
other = tf.Variable(tf.ones([rows // 4, dim]), name="other")  # 16 MiB, saved in its own write
ids = tf.constant([1, 5, 99])
touch = tf.group(tf.compat.v1.scatter_add(table, ids, tf.ones([3, dim])), tf.gather(table, ids),
                 tf.compat.v1.scatter_add(other, ids, tf.ones([3, dim])))
ours = tf.compat.v1.train.Saver([table, other], builder=OneAtATimeSaverBuilder(), sharded=True)
plain = tf.compat.v1.train.Saver([table, other], sharded=True)


def rss(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


saver = ours if sys.argv[2] == "ours" else plain
with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(touch)  # a sparse update: the variables are in copy-on-read mode now
    before = rss("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident memory
    os.makedirs(f"{sys.argv[1]}/{sys.argv[2]}")
    saver.save(session, f"{sys.argv[1]}/{sys.argv[2]}/model.ckpt", write_meta_graph=False)
    peak = (rss("VmHWM") - before) / MIB
print(json.dumps({"peak": peak}))
'''


def save_peak(tmp_path, saver: str) -> subprocess.Popen:
    # oneDNN's pooling allocator would hide a copy in memory it already holds: the default one shows it.
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "PATH": "/usr/bin:/bin"}
    return subprocess.Popen([sys.executable, "-c", SAVE_PEAK, str(tmp_path), saver], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_a_save_after_sparse_updates_does_not_copy_the_tables(tmp_path):
    runs = {name: save_peak(tmp_path, name) for name in ("ours", "plain")}
    peaks = {}
    for name, run in runs.items():
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
        peaks[name] = json.loads(out.strip().splitlines()[-1])["peak"]
    # The plain Saver copies both variables (80 MiB) before it writes; ours reads them in place.
    assert peaks["plain"] > 70, f"the plain Saver was expected to copy the tables: {peaks}"
    assert peaks["ours"] < 20, f"a save copied the tables: {peaks}"

    # Each large variable has its own data file, and the checkpoint reads back as the plain one's.
    assert len(list((tmp_path / "ours").glob("model.ckpt.data-*-of-00002"))) == 2
    ours = tf.train.load_checkpoint(str(tmp_path / "ours" / "model.ckpt"))
    plain = tf.train.load_checkpoint(str(tmp_path / "plain" / "model.ckpt"))
    for name in ("table", "other"):
        np.testing.assert_array_equal(ours.get_tensor(name), plain.get_tensor(name))
    assert ours.get_tensor("table")[[1, 5, 99]].tolist() == [[1.0] * 16] * 3, "the update before the save is in it"
