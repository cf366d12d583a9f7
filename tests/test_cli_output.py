"""``airflow-tf``'s stdout is its result alone, whatever the library logs while it works, and
``prepare --vocabularies`` keeps vocabularies as the operator's ``vocabularies=`` does. Quick:
no training (the whole chain with a model of the user's is in test_cli_pipeline.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from airflow_tf import demo
from airflow_tf.cli import main
from airflow_tf.data import load_schema, prepare_dataset
from airflow_tf.runtime.logs import log

AIRFLOW_TF = str(Path(sys.executable).with_name("airflow-tf"))


def airflow_tf(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([AIRFLOW_TF, *args], cwd=workdir, env={"PATH": os.environ["PATH"], "HOME": str(workdir)},
                          text=True, capture_output=True, timeout=300)


def test_a_result_is_alone_on_stdout_whatever_the_work_writes_there(tmp_path, monkeypatch, capfd):
    """``airflow-tf demo > summary.json``: the log lines, prints and child processes of the work
    (here a stand-in for the DAG run) go to stderr; stdout is the JSON result."""
    def noisy_run_demo(workdir, dags_folder, plane=None):
        log("airflow-tf model code my_model from /runs/code/abc sha256=abc")  # a training task's log line
        print("a print of the library")
        os.write(1, b"TensorFlow's C++ code on descriptor 1\n")
        subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)
        return {"exported_model": str(workdir)}

    monkeypatch.setattr(demo, "run_demo", noisy_run_demo)
    assert main(["demo", "--workdir", str(tmp_path)]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out) == {"exported_model": str(tmp_path)}
    for line in ("airflow-tf model code my_model", "a print of the library", "descriptor 1", "a child process"):
        assert line in err
    print("after the command")  # stdout is stdout again once the command is done
    assert capfd.readouterr().out == "after the command\n"


def test_render_prints_only_the_manifests(tmp_path):
    done = airflow_tf(tmp_path, "render", "--name", "demo", "--ps", "1", "--workers", "2", "--image", "tf:2.21",
                      "--dataset", "/data/linear/1")
    assert done.returncode == 0, done.stderr
    assert [d["kind"] for d in yaml.safe_load_all(done.stdout)] == ["Job", "Service", "NetworkPolicy", "Job"]


@pytest.fixture
def clicks(tmp_path) -> Path:
    """Clicks by user (text ids) and item (integer ids); u0 the most frequent user, then u1."""
    rows = ["user,item,clicked"] + [f"u{i % 7 % 3},{i % 5},{i % 2}" for i in range(300)]
    (tmp_path / "clicks.csv").write_text("\n".join(rows) + "\n")
    return tmp_path / "clicks.csv"


def test_prepare_keeps_the_vocabularies_the_operator_keeps(clicks, tmp_path):
    done = airflow_tf(tmp_path, "prepare", "--input", str(clicks), "--output", "cli", "--name", "clicks",
                      "--label", "clicked", "--vocabularies", "user,item", "--quiet")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    # What PrepareTFRecordsOperator(vocabularies=...) does: prepare_dataset(vocabularies=...).
    operator = prepare_dataset(str(clicks), tmp_path / "operator", "clicks", label="clicked",
                               vocabularies=["user", "item"])
    assert summary["schema"]["vocabularies"] == operator["schema"]["vocabularies"]
    schema = load_schema(summary["dataset_uri"])
    assert schema.vocabulary("user") == ["u0", "u1", "u2"] == load_schema(operator["dataset_uri"]).vocabulary("user")
    assert sorted(schema.vocabulary("item")) == ["0", "1", "2", "3", "4"]

    sized = airflow_tf(tmp_path, "prepare", "--input", str(clicks), "--output", "cli", "--name", "sized",
                       "--label", "clicked", "--vocabularies", '{"user": 2}', "--quiet")
    assert sized.returncode == 0, sized.stderr
    assert load_schema(json.loads(sized.stdout)["dataset_uri"]).vocabulary("user") == ["u0", "u1"]


@pytest.mark.parametrize(("value", "status", "message"), [
    ("usr", 1, "--vocabularies: 'usr' is not a column of the input (columns: user, item, clicked)"),
    ("clicked", 1, "--vocabularies: 'clicked' is the label"),
    ('{"user": 0}', 1, "--vocabularies: the size of 'user' must be a whole number >= 1"),
    ('{"user": ', 2, "argument --vocabularies: '{\"user\": ' is not JSON (Expecting value at character 10); "
                     "expected an object of sizes"),
    ("@missing.json", 2, "argument --vocabularies: cannot read missing.json"),
])
def test_prepare_refuses_a_bad_vocabularies_value_naming_the_flag(clicks, tmp_path, value, status, message):
    done = airflow_tf(tmp_path, "prepare", "--input", str(clicks), "--output", "cli", "--name", "clicks",
                      "--label", "clicked", "--vocabularies", value, "--quiet")
    assert done.returncode == status and message in done.stderr, done.stderr
    assert done.stdout == "" and not (tmp_path / "cli" / "clicks").exists(), "nothing prepared"
