"""The private plane's DIR/env (airflow_tf.plane_env): what scripts/kube writes the demo and the tests
read back as written; a file no one could read back is refused, naming the file, line or key."""

from __future__ import annotations

import pytest

from airflow_tf.demo import plane_settings
from airflow_tf.plane_env import read_plane_env, write_plane_env


def test_settings_written_are_read_back_as_they_were(tmp_path):
    settings = {"KUBECONFIG": str(tmp_path / "kubeconfig"), "AIRFLOW_TF_KUBE_NODES": "node-1,node-2",
                "AIRFLOW_TF_KUBE_STORAGE": "/tmp/a b=c", "AIRFLOW_TF_KUBE_POD_GROUP": "1000", "EMPTY": ""}
    write_plane_env(tmp_path / "env", settings)
    assert (tmp_path / "env").read_text().splitlines()[0] == f"KUBECONFIG={tmp_path / 'kubeconfig'}"
    assert read_plane_env(tmp_path / "env") == settings
    assert plane_settings(tmp_path) == settings


@pytest.mark.parametrize(("key", "value", "refusal"), [
    ("KUBECONFIG", "/tmp/x\nEVIL=1", r"the value of KUBECONFIG has a line break"),
    ("BAD KEY", "1", r"'BAD KEY' is not a variable name"),
    ("A=B", "1", r"'A=B' is not a variable name"),
])
def test_a_setting_no_one_could_read_back_is_refused_and_nothing_written(tmp_path, key, value, refusal):
    with pytest.raises(ValueError, match=refusal):
        write_plane_env(tmp_path / "env", {"AIRFLOW_TF_KUBE_NODES": "node-1", key: value})
    assert not (tmp_path / "env").exists()


def test_a_line_that_is_no_setting_is_refused_naming_the_file_and_line(tmp_path):
    (tmp_path / "env").write_text("KUBECONFIG=/tmp/k\njust words\n")
    with pytest.raises(ValueError, match=r"env:2: 'just words' is not a KEY=value line"):
        read_plane_env(tmp_path / "env")
    with pytest.raises(SystemExit, match=r"airflow-tf demo: .*env:2: 'just words' is not a KEY=value line"):
        plane_settings(tmp_path)
