"""Prepare on the Airflow side: PrepareTFRecordsOperator run by Airflow itself (``airflow dags
test``, SQLite, temporary home), and the options tf_prepare checks while the DAG is parsed. A
training image has no Airflow, so these are the data tests it leaves out."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import textwrap

import pytest

from airflow_tf.data import DataError, count_examples, load_schema, prepare_dataset
from airflow_tf.data.options import DEFAULTS, PrepareOptions
from airflow_tf.data.samples import write_linear_regression_csv
from airflow_tf.demo import airflow_env, dags_test

DAG_FILE = '''
import json
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task
from airflow_tf.operators import PrepareTFRecordsOperator


@task
def record(summary, path):
    Path(path).write_text(json.dumps(summary))


# Three prepares in one run (each ``dags test`` costs seconds of CPU): a good input, a ragged one
# that fails alone, and text read as text, committed after the good one as the next version.
with DAG("prepare_dags", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         params={{"name": "templated", "fraction": 0.25, "text": "code"}}) as dag:
    prepares = {{}}
    for case, source, text in (("ok", {good!r}, ""), ("bad", {bad!r}, ""), ("text", {mixed!r}, "{{{{ params.text }}}}")):
        prepares[case] = PrepareTFRecordsOperator(
            task_id=f"prepare_{{case}}", input=source, output={output!r}, name="{{{{ params.name }}}}", label="y",
            eval_fraction="{{{{ params.fraction }}}}", shards="3", progress_every=0, string_columns=text,
        )
        record.override(task_id=f"record_{{case}}")(prepares[case].output, f"{results}/{{case}}.json")
    prepares["ok"] >> prepares["text"]
'''


@pytest.mark.slow
def test_operator_runs_in_airflow_with_templates_progress_and_xcom(tmp_path, migrated_airflow_db):
    good = write_linear_regression_csv(tmp_path / "raw" / "lr.csv", rows=20000, seed=3)
    bad = tmp_path / "raw" / "ragged.csv"
    bad.write_text("x,y\n1,2\n3\n")
    mixed = tmp_path / "raw" / "mixed.csv"  # a code column of numbers, with letters deep down
    mixed.write_text("code,y\n" + "".join(f"{'A7' if i == 1500 else i},{i % 2}\n" for i in range(2000)))
    output, results = tmp_path / "datasets", tmp_path / "xcom"
    results.mkdir()
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "prepare_dags.py").write_text(textwrap.dedent(DAG_FILE.format(
        good=str(good), bad=str(bad), mixed=str(mixed), output=str(output), results=str(results))))
    env = airflow_env(tmp_path, dags)
    migrated_airflow_db(env)

    run = dags_test(env, "prepare_dags")
    assert "state=failed" in run.stdout, "the ragged input fails its task, and so the run"
    summary = json.loads((results / "ok.json").read_text())  # the XCom as the downstream task received it
    uri = summary["dataset_uri"]
    assert uri == str((output / "templated" / "1").resolve())
    # A row's split is a hash of (file, row, seed): about eval_fraction (0.25) of the rows.
    counts = summary["counts"]
    assert counts["train"] + counts["eval"] == 20000 and 4700 < counts["eval"] < 5300
    assert summary["shards"]["train"] == 3
    assert summary["schema"] == {"format_version": 1, "label": "y", "features": [
        {"name": "x", "dtype": "float32", "shape": [], "allow_nan": False},
        {"name": "y", "dtype": "float32", "shape": [], "allow_nan": False}]}
    assert load_schema(uri).label_name == "y" and count_examples(uri, "eval") == counts["eval"]
    assert "prepare write: 20000/20000 rows (100.0%)" in run.stdout and "rows/s" in run.stdout

    assert f"{bad} line 3: expected 2 fields (the header's), found 1" in run.stdout
    assert not (results / "bad.json").exists(), "nothing downstream of the failed prepare ran"

    # string_columns (templated) reads the code column as text: committed as the next version,
    # the failed prepare having taken none.
    summary = json.loads((results / "text.json").read_text())
    assert summary["dataset_uri"] == str((output / "templated" / "2").resolve())
    assert summary["schema"]["features"][0] == {"name": "code", "dtype": "string", "shape": []}
    assert sorted(path.name for path in (output / "templated").iterdir() if path.name.isdigit()) == ["1", "2"]


def test_the_partition_key_goes_on_the_airflow_asset_event_or_a_log_line_says_why_not():
    from airflow.sdk.definitions.asset import AssetUniqueKey
    from airflow.sdk.execution_time.context import OutletEventAccessor

    from airflow_tf import compat
    from airflow_tf.operators.prepare import emit_partition

    event = OutletEventAccessor(key=AssetUniqueKey(name="airflow_tf.dataset.clicks", uri="airflow_tf.dataset.clicks"))

    # On the Airflow installed here: with asset partitions (3.2+) the key goes on the event.
    assert emit_partition(event, "2026-11-03") is compat.has_asset_partitions()
    if compat.has_asset_partitions():
        assert event.partition_keys == {"2026-11-03"}

    class OlderEvent:  # an outlet event of Airflow 3.1, which has no partitions
        extra: dict = {}

    class Collect(logging.Handler):  # on the module's logger itself: Airflow may reroute logging
        def __init__(self):
            super().__init__(logging.INFO)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    logger, collect = logging.getLogger("airflow_tf.operators.prepare"), Collect()
    level, logger.level = logger.level, logging.INFO
    logger.addHandler(collect)
    try:
        assert emit_partition(OlderEvent(), "2026-11-03") is False
    finally:
        logger.removeHandler(collect)
        logger.setLevel(level)
    assert any("has no asset partitions (3.2 or later needed)" in m and "'2026-11-03'" in m for m in collect.messages)


def test_every_front_has_the_options_defaults():
    """prepare_dataset, the operator and the command line show the defaults PrepareOptions declares."""
    from airflow_tf.cli import _add_prepare
    from airflow_tf.operators import PrepareTFRecordsOperator

    function = inspect.signature(prepare_dataset).parameters
    operator = inspect.signature(PrepareTFRecordsOperator.__init__).parameters
    commands = argparse.ArgumentParser().add_subparsers()
    _add_prepare(commands)
    flags = {action.dest: action.default for action in commands.choices["prepare"]._actions}
    for option in dataclasses.fields(PrepareOptions):
        default = getattr(DEFAULTS, option.name)
        if option.name in ("schema", "string_columns"):  # None there stands for none
            continue
        assert function[option.name].default == default, option.name
        assert operator[option.name].default == default, option.name
        if option.name not in ("vocabularies", "compression", "allow_nan"):  # the flags' own forms of none
            assert flags[option.name] == default, option.name


@pytest.mark.parametrize(("options", "complaint"), [
    ({"eval_fraktion": 0.1}, r"tf_prepare: unknown option\(s\) eval_fraktion; the options are label, eval_fraction"),
    ({"eval_fraction": 1.5}, r"eval_fraction must be in \[0, 1\), got 1.5"),
    ({"shards": 2, "target_shard_mib": 8}, "give either shards or target_shard_mib, not both"),
    ({"overwrite": "ture"}, "overwrite"),
])
def test_tf_prepares_options_are_checked_while_the_dag_is_parsed(tmp_path, options, complaint):
    from airflow.sdk import DAG

    from airflow_tf.task_groups import tf_prepare

    with DAG("parted_bad", schedule=None), pytest.raises((DataError, ValueError), match=complaint):
        tf_prepare(input=str(tmp_path), name="clicks", **options)


def test_tf_prepares_templated_options_wait_for_the_plan(tmp_path):
    from airflow.sdk import DAG

    from airflow_tf.task_groups import tf_prepare

    with DAG("parted_templated", schedule=None) as dag:
        tf_prepare(input=str(tmp_path), name="clicks", eval_fraction="{{ params.fraction }}", overwrite="{{ params.o }}",
                   version=3, label="y")
    *_, options = dag.get_task("prepare.plan").op_args  # rendered and checked when the plan runs
    assert options["eval_fraction"] == "{{ params.fraction }}" and options["overwrite"] == "{{ params.o }}"
