"""Prepare's options are one value, PrepareOptions: declared once with their defaults and checks,
taken whole by one prepare, the part planner, the operator and the command line, so each front
has the same defaults and refuses the same bad values with the same words. Renamed options
(``workers`` -> ``encode_threads``, ``target_shard_mb`` -> ``target_shard_mib``, ``partitions``
-> ``parts``) keep working until 0.3.0, with the project's deprecation warning."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_tf.data import DataError, prepare_dataset
from airflow_tf.data.options import DEFAULTS, PrepareOptions
from airflow_tf.data.parts import plan_parts, prepare_partitioned
from airflow_tf.data.samples import write_linear_regression_csv
from airflow_tf.deprecation import AirflowTFDeprecationWarning


def test_the_options_are_frozen_and_rendered_template_text_is_parsed():
    options = PrepareOptions(label="y", eval_fraction="0.25", seed="7", shards="3", compression="GZIP",
                             string_columns="zip, id", allow_nan="yes", encode_threads="2", buffer_mib="64")
    assert (options.eval_fraction, options.seed, options.shards, options.compression) == (0.25, 7, 3, "gzip")
    assert (options.string_columns, options.allow_nan, options.encode_threads, options.buffer_mib) == \
        (("zip", "id"), True, 2, 64.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 8  # type: ignore[misc]
    unset = PrepareOptions(label="", eval_fraction="None", seed="", shards="None", buffer_mib=None)
    assert unset == DEFAULTS, "a template that rendered nothing means the default"
    assert DEFAULTS.eval_fraction == 0.2 and DEFAULTS.buffer_mib == 512


@pytest.mark.parametrize(("values", "message"), [
    ({"eval_fraction": 1.5}, r"eval_fraction must be in \[0, 1\), got 1.5"),
    ({"eval_fraction": "a fifth"}, r"eval_fraction must be a number, got 'a fifth'"),
    ({"shards": 4, "target_shard_mib": 64}, "give either shards or target_shard_mib, not both"),
    ({"target_shard_mib": 0}, r"target_shard_mib must be positive \(MiB per train file\), got 0"),
    ({"shards": 0}, "shards must be between 1 and 10,000, got 0"),
    ({"compression": "lz4"}, "compression 'lz4' is not supported; use 'gzip', 'zlib' or none"),
    ({"encode_threads": 0}, "encode_threads must be at least 1, got 0"),
    ({"buffer_mib": 0.5}, r"buffer_mib must be at least 1 \(MiB of buffered rows\), got 0.5"),
    ({"allow_nan": "ture"}, "allow_nan: expected true or false, got 'ture'"),
])
def test_a_bad_option_is_refused_naming_it(values, message):
    with pytest.raises(DataError, match=message):
        PrepareOptions(**values)


def test_options_given_whole_make_the_same_version_as_options_given_one_by_one(tmp_path):
    source = write_linear_regression_csv(tmp_path / "in.csv", rows=600)
    one_by_one = prepare_dataset(source, tmp_path / "out", "a", label="y", eval_fraction=0.25, seed=3, shards=2)
    whole = prepare_dataset(source, tmp_path / "out", "b",
                            options=PrepareOptions(label="y", eval_fraction=0.25, seed=3, shards=2))
    assert (whole["counts"], whole["shards"]) == (one_by_one["counts"], one_by_one["shards"])
    with pytest.raises(DataError, match="give options=PrepareOptions.* or the options one by one, not both"):
        prepare_dataset(source, tmp_path / "out", "c", label="y", options=PrepareOptions(label="y"))


def test_the_old_names_still_work_with_the_projects_warning_and_the_cache_still_matches(tmp_path):
    source = write_linear_regression_csv(tmp_path / "in.csv", rows=600)
    with pytest.warns(AirflowTFDeprecationWarning, match=r"target_shard_mb=.* use target_shard_mib=") as caught:
        old = prepare_dataset(source, tmp_path / "out", "lr", label="y", target_shard_mb=1, cache=True)
    assert caught[0].filename == __file__, "the warning points at the caller's line"
    with pytest.warns(AirflowTFDeprecationWarning, match=r"workers=.* use encode_threads="):
        prepare_dataset(source, tmp_path / "out", "other", label="y", workers=1)
    new = prepare_dataset(source, tmp_path / "out", "lr", label="y", target_shard_mib=1, cache=True)
    assert new["cached"] and new["version"] == old["version"], "a version cached before the rename is reused"
    with pytest.warns(AirflowTFDeprecationWarning), pytest.raises(ValueError, match="give encode_threads only"):
        prepare_dataset(source, tmp_path / "out", "both", label="y", workers=1, encode_threads=2)


def test_the_part_planner_takes_the_options_whole_and_the_old_parts_name(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(3):
        write_linear_regression_csv(folder / f"{index}.csv", rows=400, seed=index)
    plan = plan_parts(folder, tmp_path / "out", "whole", 2, options=PrepareOptions(label="y", eval_fraction=0.25))
    assert len(plan["parts"]) == 2 and plan["options"]["eval_fraction"] == 0.25
    with pytest.warns(AirflowTFDeprecationWarning, match=r"partitions=.* use parts="):
        summary = prepare_partitioned(folder, tmp_path / "out", "old", partitions=3, label="y")
    assert summary["parts"] == 3
    with pytest.raises(DataError, match="vocabularies are counted over all the training rows, which no part sees"):
        plan_parts(folder, tmp_path / "out", "vocab", 2, label="y", vocabularies=["x"])


def test_the_command_line_takes_the_new_flags_and_says_the_old_ones_are_deprecated(tmp_path):
    source = write_linear_regression_csv(tmp_path / "in.csv", rows=600)
    command = [sys.executable, "-m", "airflow_tf.cli", "prepare", "--input", str(source), "--output",
               str(tmp_path / "out"), "--label", "y", "--quiet"]
    new = subprocess.run([*command, "--name", "new", "--target-shard-mib", "1", "--encode-threads", "1"],
                         capture_output=True, text=True, check=True)
    assert "deprecated" not in new.stderr and json.loads(new.stdout)["rows"] == 600
    old = subprocess.run([*command, "--name", "old", "--target-shard-mb", "1", "--workers", "1"],
                         capture_output=True, text=True, check=True)
    assert "--target-shard-mb is deprecated and will be removed in airflow-tf 0.3.0: use --target-shard-mib" in old.stderr
    assert "--workers is deprecated and will be removed in airflow-tf 0.3.0: use --encode-threads" in old.stderr
    assert json.loads(old.stdout)["counts"] == json.loads(new.stdout)["counts"]
    bad = subprocess.run([*command, "--name", "bad", "--encode-threads", "0"], capture_output=True, text=True)
    assert bad.returncode == 1 and "--encode-threads must be at least 1, got 0" in bad.stderr
    assert not Path(tmp_path / "out" / "bad").exists()


def test_a_parts_command_takes_encode_threads_and_still_its_old_flag(tmp_path, capsys):
    from airflow_tf.cluster.components import part_command
    from airflow_tf.data.__main__ import main

    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(2):
        write_linear_regression_csv(folder / f"{index}.csv", rows=300, seed=index)
    plan = plan_parts(folder, tmp_path / "out", "pods", 2, label="y")
    command = part_command(plan["directory"], 0, encode_threads=1)
    assert command[command.index("--encode-threads") + 1] == "1"
    assert main(command[3:]) == 0 and "deprecated" not in capsys.readouterr().err
    assert main(["part", "--plan", plan["directory"], "--index", "1", "--workers", "1"]) == 0
    assert "--workers is deprecated and will be removed in airflow-tf 0.3.0: use --encode-threads" in \
        capsys.readouterr().err
