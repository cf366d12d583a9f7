"""The model's code snapshot: what the launch copies into the run directory, and what it leaves
to the training image. Pure Python: the model module is located, never imported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from airflow_tf.cluster.model_code import (CODE_DIR, MANIFEST_FILE, ModelCodeError, code_hash, model_code_record,
                                           read_model_code, snapshot_model_code)

MODEL = "import keras\n\ndef build():\n    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])\n"


@pytest.fixture
def dags(tmp_path) -> Path:
    """A DAGs folder outside the project, not on this process's sys.path."""
    folder = tmp_path / "dags"
    folder.mkdir()
    return folder


def snapshots(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / CODE_DIR).iterdir())


def test_a_module_next_to_the_dag_is_copied_into_the_run_directory_without_being_imported(dags, tmp_path):
    # Importing it would fail: the launcher must not run the model module (nor TensorFlow).
    (dags / "my_model.py").write_text("raise RuntimeError('imported at launch')\n" + MODEL)
    code = snapshot_model_code("my_model:build", str(tmp_path / "run"), [str(dags)])
    assert "my_model" not in sys.modules
    assert code is not None
    copied = Path(code.path)
    assert copied.parent == tmp_path / "run" / CODE_DIR and copied.name == code.sha256[:16]
    assert (copied / "my_model.py").read_text() == (dags / "my_model.py").read_text()
    assert sorted(p.name for p in copied.iterdir()) == [MANIFEST_FILE, "my_model.py"]
    path, digest = code  # what the launch sets as code_dir, and the hash
    assert read_model_code(path) == code and digest == code_hash(copied)
    assert model_code_record(path) == {"sha256": digest, "model": "my_model:build", "path": path,
                                       "source": str(dags / "my_model.py"), "files": 1,
                                       "bytes": (dags / "my_model.py").stat().st_size}
    assert model_code_record(None) is None and read_model_code(str(tmp_path)) is None


def test_a_retried_launch_reuses_the_snapshot_and_changed_code_gets_its_own(dags, tmp_path):
    (dags / "my_model.py").write_text(MODEL)
    run_dir = tmp_path / "run"
    first = snapshot_model_code("my_model:build", str(run_dir), [str(dags)])
    again = snapshot_model_code("my_model:build", str(run_dir), [str(dags)])
    assert again == first and snapshots(run_dir) == [Path(first.path).name], "no temporary directory is left"

    (dags / "my_model.py").write_text(MODEL.replace("Dense(1)", "Dense(1, use_bias=False)"))
    changed = snapshot_model_code("my_model:build", str(run_dir), [str(dags)])
    assert changed.sha256 != first.sha256
    assert snapshots(run_dir) == sorted([Path(first.path).name, Path(changed.path).name])
    assert "Dense(1)" in (Path(first.path) / "my_model.py").read_text(), "the running group's code is untouched"


def test_the_hash_depends_on_content_and_relative_paths_only(dags, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    for folder in (dags, other):
        (folder / "my_model.py").write_text(MODEL)
    one = snapshot_model_code("my_model:build", str(tmp_path / "a"), [str(dags)])
    two = snapshot_model_code("my_model:build", f"file://{tmp_path / 'b'}", [str(other)])
    assert one.sha256 == two.sha256 and len(one.sha256) == 64
    (Path(two.path) / "my_model.py").write_text(MODEL + "\n")
    assert code_hash(two.path) != one.sha256


def test_a_package_is_copied_whole_without_caches_and_hidden_files(dags, tmp_path):
    package = dags / "team_models"
    (package / "vision" / "__pycache__").mkdir(parents=True)
    (package / ".git").mkdir()
    (package / "__init__.py").write_text("")
    (package / "layers.py").write_text("SCALE = 2\n")
    (package / "vision" / "__init__.py").write_text("")
    (package / "vision" / "nets.py").write_text("from team_models.layers import SCALE\n" + MODEL)
    (package / "vision" / "__pycache__" / "nets.cpython-311.pyc").write_bytes(b"\0" * 100)
    (package / ".git" / "config").write_text("[core]\n")
    (package / ".env").write_text("API_TOKEN=secret\n")
    (package / "vocab.txt").write_text("a\nb\n")
    (tmp_path / "secret.key").write_text("private")
    (package / "key.pem").symlink_to(tmp_path / "secret.key")

    code = snapshot_model_code("team_models.vision.nets:build", str(tmp_path / "run"), [str(dags)])
    copied = sorted(p.relative_to(code.path).as_posix() for p in Path(code.path).rglob("*") if p.is_file())
    assert copied == [MANIFEST_FILE, "team_models/__init__.py", "team_models/layers.py",
                      "team_models/vision/__init__.py", "team_models/vision/nets.py", "team_models/vocab.txt"]
    manifest = json.loads((Path(code.path) / MANIFEST_FILE).read_text())
    assert manifest["sha256"] == code.sha256 and manifest["source"] == str(package) and len(manifest["files"]) == 5

    with pytest.raises(ModelCodeError, match=r"package 'team_models' \(.*dags/team_models\) has no module "
                                             r"'team_models.vision.missing'"):
        snapshot_model_code("team_models.vision.missing:build", str(tmp_path / "run"), [str(dags)])


def test_code_above_the_size_limit_is_refused_naming_the_directory_and_size(dags, tmp_path):
    package = dags / "big_model"
    package.mkdir()
    (package / "__init__.py").write_text(MODEL)
    (package / "weights.bin").write_bytes(b"\1" * 11_000_000)
    with pytest.raises(ModelCodeError, match=rf"{package} holds 11.0 MB in 2 files, above the 10 MB limit "
                                             "for model code copied into the run directory; keep data"):
        snapshot_model_code("big_model:build", str(tmp_path / "run"), [str(dags)])
    assert not (tmp_path / "run").exists(), "nothing is written for refused code"


@pytest.mark.parametrize("model", [
    "linear_regression",                       # built in
    "numpy.linalg:norm",                       # installed in site-packages
    "airflow_tf.runtime.models:linear_regression",  # an editable install of a distribution
    "json.decoder:JSONDecoder",                # the standard library
    "math:sqrt",                               # an extension module of the interpreter
    "only_in_the_training_image:build",        # not found here: the image must provide it
])
def test_installed_builtin_and_unknown_modules_are_not_copied(model, tmp_path):
    assert snapshot_model_code(model, str(tmp_path / "run")) is None
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("model", ["../../etc/passwd:x", "my model:build", "my_model:", "pkg..mod:build"])
def test_a_reference_that_is_not_a_python_path_is_refused(model, tmp_path):
    with pytest.raises(ModelCodeError, match="use 'package.module:function'"):
        snapshot_model_code(model, str(tmp_path / "run"))


def test_a_corrupt_manifest_is_a_clear_error(dags, tmp_path):
    (dags / "my_model.py").write_text(MODEL)
    code = snapshot_model_code("my_model:build", str(tmp_path / "run"), [str(dags)])
    (Path(code.path) / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ModelCodeError, match=rf"model code manifest {code.path}/{MANIFEST_FILE} cannot be read"):
        read_model_code(code.path)
