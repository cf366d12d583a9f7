"""Partitioned prepare: one version written by parallel parts, committed in one step, holding
exactly the records per split that one prepare writes; a part that did not finish commits nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_tf.data import DataError, prepare_dataset
from airflow_tf.data.parts import commit_parts, plan_parts, prepare_part, prepare_partitioned


def _inputs(tmp_path: Path) -> Path:
    """Three CSV files and a Parquet file of rows with a unique id, a float, text and a label."""
    folder = tmp_path / "raw"
    folder.mkdir()
    start = 0
    for index, rows in enumerate((3000, 500, 1700)):
        ids = range(start, start + rows)
        lines = ["id,x,word,y"] + [f"{i},{i / 7:.5f},w{i % 13},{i % 2}" for i in ids]
        (folder / f"day-{index}.csv").write_text("\n".join(lines) + "\n")
        start += rows
    ids = np.arange(start, start + 2200)
    pq.write_table(pa.table({"id": ids, "x": np.round(ids / 7, 5), "word": [f"w{i % 13}" for i in ids],
                             "y": ids % 2}), folder / "day-3.parquet")
    return folder


def _records(uri: str, split: str, read_split) -> Counter:
    rows = read_split(uri, split)
    return Counter(zip(rows["id"].tolist(), rows["x"].tolist(), [w.decode() for w in rows["word"]], rows["y"].tolist()))


def test_partitioned_prepare_writes_the_same_records_per_split_as_one_prepare(tmp_path, read_split):
    folder = _inputs(tmp_path)
    options = dict(label="y", eval_fraction=0.25, seed=7, compression="gzip")
    single = prepare_dataset(folder, tmp_path / "out", "single", **options)
    parted = prepare_partitioned(folder, tmp_path / "out", "parted", parts=3, **options)
    assert parted["parts"] == 3 and parted["rows"] == single["rows"] == 7400
    assert parted["counts"] == single["counts"] and parted["schema"] == single["schema"]
    for split in ("train", "eval"):
        assert _records(parted["dataset_uri"], split, read_split) == _records(single["dataset_uri"], split, read_split)
    manifest = json.loads(Path(parted["dataset_uri"], "_SUCCESS").read_text())
    files = sorted(p.name for p in Path(parted["dataset_uri"], "train").iterdir())
    assert files == [s["file"] for s in manifest["splits"]["train"]["shards"]]
    assert all(f.endswith(".tfrecord.gz") for f in files)
    # The parts' working directory is gone once committed.
    assert not list((tmp_path / "out" / "parted").glob(".parts-*"))


# Runs in a fresh interpreter (a fork of the test process could inherit locked thread pools).
KILL_AFTER_FIRST_WRITE = r"""
import os, signal, sys
from airflow_tf.data.parts import prepare_part

def stop(progress):
    if progress.done:
        os.kill(os.getpid(), signal.SIGKILL)

prepare_part(sys.argv[1], int(sys.argv[2]), progress=stop, progress_every=0)
"""


def test_a_part_killed_mid_write_commits_nothing(tmp_path):
    folder = _inputs(tmp_path)
    output = tmp_path / "out"
    plan = plan_parts(folder, output, "killed", parts=2, label="y")
    prepare_part(plan, 0)
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_FIRST_WRITE, plan["directory"], "1"],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    with pytest.raises(DataError, match=r"part 1 of 2 of dataset 'killed' did not finish .*run that part again"):
        commit_parts(plan)
    root = output / "killed"
    assert not [p for p in root.iterdir() if not p.name.startswith(".parts-")]  # no version, no temporary
    assert not list(root.rglob("_SUCCESS"))

    # Running the part again completes the plan.
    prepare_part(plan, 1)
    summary = commit_parts(plan)
    assert summary["version"] == "1" and summary["rows"] == 7400


def test_plan_refuses_bad_options_and_a_damaged_part(tmp_path):
    folder = _inputs(tmp_path)
    with pytest.raises(DataError, match="parts must be a whole number of parallel parts, at least 1, got 0"):
        plan_parts(folder, tmp_path / "out", "bad", parts=0)
    plan = plan_parts(folder, tmp_path / "out", "bad", parts=8, label="y")
    assert len(plan["parts"]) == 4  # one part per file at most
    assert sorted(f for part in plan["parts"] for f in part) == plan["files"]
    for index in range(4):
        prepare_part(plan, index)
    shard = next(Path(plan["directory"], "part-2").glob("*/part-*"))
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"part 2: .* is \d+ bytes where the part wrote \d+; run part 2 again"):
        commit_parts(plan)
    assert not list((tmp_path / "out" / "bad").rglob("_SUCCESS"))


DAG_FILE = '''
import json
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task
from airflow_tf.task_groups import tf_prepare

for dag_id, source in (("parted_ok", {good!r}), ("parted_bad", {bad!r})):
    with DAG(dag_id, schedule=None, start_date=datetime(2024, 1, 1), catchup=False) as dag:
        prepared = tf_prepare(input=source, output={output!r}, name="parted", parts=2, label="y",
                              eval_fraction=0.25, seed=7, progress_every=0)

        @task
        def record(summary):
            Path({result!r}).write_text(json.dumps(summary))

        record(prepared.output)
    globals()[dag_id] = dag
'''


@pytest.mark.slow
def test_partitioned_prepare_runs_as_mapped_airflow_tasks(tmp_path, read_split, migrated_airflow_db):
    from airflow_tf.demo import airflow_env, dags_test

    folder = _inputs(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("day-0.csv", "day-1.csv"):
        (bad / name).write_text((folder / name).read_text())
    with open(bad / "day-1.csv", "a") as handle:
        handle.write("9999,0.5,w1,oops\n")  # the label of the last row is not a number
    output, result = tmp_path / "datasets", tmp_path / "xcom.json"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "parted_dags.py").write_text(textwrap.dedent(DAG_FILE.format(
        good=str(folder), bad=str(bad), output=str(output), result=str(result))))
    env = airflow_env(tmp_path, dags)
    migrated_airflow_db(env)

    run = dags_test(env, "parted_ok")
    assert "state=success" in run.stdout, run.stdout[-4000:]
    summary = json.loads(result.read_text())
    assert summary["parts"] == 2 and summary["rows"] == 7400
    assert summary["dataset_uri"] == str((output / "parted" / "1").resolve())
    single = prepare_dataset(folder, tmp_path / "single", "single", label="y", eval_fraction=0.25, seed=7)
    for split in ("train", "eval"):
        assert _records(summary["dataset_uri"], split, read_split) == _records(single["dataset_uri"], split, read_split)

    failed = dags_test(env, "parted_bad")
    assert "state=failed" in failed.stdout
    assert "day-1.csv line 502, column 'y'" in failed.stdout, failed.stdout[-4000:]
    assert sorted(p.name for p in (output / "parted").iterdir() if not p.name.startswith(".")) == ["1"]
