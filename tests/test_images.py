"""The container images (no Docker engine here): every file the Dockerfiles copy exists, the
base images match the versions the project pins, the training image runs the command the
backends give their tasks, the package installs and runs its runtime WITHOUT Airflow
(``.[tensorflow]``), and the Airflow image's install brings no TensorFlow (``.[airflow]``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from airflow_tf.backends.kubernetes.pod_options import DEFAULT_USER
from airflow_tf.cluster.spec import RUNTIME_COMMAND

ROOT = Path(__file__).resolve().parents[1]
IMAGES = {name: ROOT / "images" / name / "Dockerfile" for name in ("training", "training-gpu", "airflow")}
TRAINING_IMAGES = ("training", "training-gpu")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def copy_sources(dockerfile: Path) -> list[str]:
    """Paths in the build context (the repository root) that COPY/ADD read."""
    sources = []
    for keyword, args in instructions(dockerfile):
        if keyword not in ("COPY", "ADD"):
            continue
        words = json.loads(args) if args.startswith("[") else shlex.split(args)
        words = [w for w in words if not w.startswith("--")]
        sources += words[:-1]
    return sources


def base_image(dockerfile: Path) -> str:
    """The FROM image with ARG defaults substituted."""
    args = {}
    for keyword, rest in instructions(dockerfile):
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value
        if keyword == "FROM":
            return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
    raise AssertionError(f"{dockerfile}: no FROM")


def pinned(name: str) -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1]
    raise AssertionError(f"constraints.txt pins no {name}")


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_every_file_a_dockerfile_copies_is_in_the_repository(image):
    sources = copy_sources(IMAGES[image])
    assert "airflow_tf" in sources and "constraints.txt" in sources and "pyproject.toml" in sources
    missing = [s for s in sources if not (ROOT / s).exists()]
    assert not missing, f"images/{image}/Dockerfile copies paths missing from the repository: {missing}"


def test_base_images_carry_the_pinned_tensorflow_airflow_and_python():
    assert base_image(IMAGES["training"]).startswith("python:3.11")
    assert base_image(IMAGES["training-gpu"]) == f"tensorflow/tensorflow:{pinned('tensorflow')}-gpu"
    assert base_image(IMAGES["airflow"]) == f"apache/airflow:{pinned('apache-airflow')}-python3.11"


@pytest.mark.parametrize("image", TRAINING_IMAGES)
def test_training_images_run_the_task_command_as_the_pod_user(image):
    steps = dict(instructions(IMAGES[image]))
    # Pods override the entrypoint with the same command; `docker run IMAGE --help` uses it.
    assert json.loads(steps["ENTRYPOINT"]) == list(RUNTIME_COMMAND)
    assert steps["USER"] == str(DEFAULT_USER), "the Kubernetes backend runs tasks as this uid"
    assert installed_extras(IMAGES[image]) == {"tensorflow"}
    installs = " ".join(a for k, a in instructions(IMAGES[image]) if k == "RUN")
    assert "apache-airflow" not in installs


def installed_extras(dockerfile: Path, build_args: dict[str, str] | None = None) -> set[str]:
    """The extras of the project that the Dockerfile's pip install names ("/path[a,b]"), with
    ``${ARG}`` taken from ``build_args`` or the ARG's default."""
    args = dict(a.split("=", 1) for k, a in instructions(dockerfile) if k == "ARG" and "=" in a)
    args.update(build_args or {})
    installs = " ".join(a for k, a in instructions(dockerfile) if k == "RUN")
    installs = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), installs)
    found = re.findall(r"/airflow-tf\[([\w,-]+)\]", installs)
    assert len(found) == 1, f"{dockerfile}: one pip install of the project, found {found}"
    return set(found[0].split(","))


def installed_distributions(extras: set[str]) -> set[str]:
    """What installing the project with ``extras`` brings: its requirements and everything they
    need, as installed here (same pinned versions)."""
    todo = [(Requirement(r), extras) for r in metadata.requires("airflow-tf") or []]
    names: set[str] = set()
    while todo:
        req, wanted = todo.pop()
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in wanted or {""}):
            continue
        name = metadata.distribution(req.name).metadata["Name"]
        key = (name.lower(), frozenset(req.extras))
        if key in names:
            continue
        names.add(key)
        todo += [(Requirement(r), req.extras) for r in metadata.requires(name) or []]
    return {name for name, _ in names}


def test_the_airflow_image_installs_no_tensorflow():
    extras = installed_extras(IMAGES["airflow"])
    assert "airflow" in extras and "tensorflow" not in extras
    installed = installed_distributions(extras)
    assert "apache-airflow" in installed
    assert not {"tensorflow", "keras", "tensorboard"} & installed, "the Airflow side imports no TensorFlow"


@pytest.mark.slow
def test_the_training_image_install_needs_no_airflow(tmp_path):
    """What `pip install ".[tensorflow]"` in images/training does, in a fresh virtual
    environment: the dependencies it brings are linked from this environment (same pinned
    versions; downloading TensorFlow again would take minutes), the package is built from the
    files the Dockerfile copies, and nothing of Airflow is there."""
    core = installed_distributions(installed_extras(IMAGES["training"]))
    assert "tensorflow" in core and not any(n.startswith("apache-airflow") for n in core)

    context = tmp_path / "context"
    for source in copy_sources(IMAGES["training"]):
        target = context / source
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / source, target)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    for name in core:
        for top in {f.parts[0] for f in metadata.distribution(name).files or [] if f.parts[0] != ".."}:
            source = Path(metadata.distribution(name).locate_file(top))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)

    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", "--no-deps", f"{context}[tensorflow]"], check=True)
    check = subprocess.run([*pip, "check"], capture_output=True, text=True)
    assert check.returncode == 0, f"the core dependencies do not cover the package's requirements:\n{check.stdout}"

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AIRFLOW_HOME")}
    cwd = tmp_path  # not the repository: imports must come from the installed package
    runtime_help = subprocess.run([python, "-m", "airflow_tf.runtime", "--help"], cwd=cwd, env=env, capture_output=True, text=True)
    assert runtime_help.returncode == 0, runtime_help.stderr
    assert "TF_CONFIG" in runtime_help.stdout and "--dataset" in runtime_help.stdout

    no_airflow = subprocess.run([python, "-c", "import airflow"], cwd=cwd, env=env, capture_output=True, text=True)
    assert no_airflow.returncode != 0 and "No module named 'airflow'" in no_airflow.stderr

    # Every module of the rooms the runtime is allowed to use imports without Airflow.
    walk = (
        "import importlib, pkgutil, airflow_tf\n"
        "for room in ('runtime', 'cluster', 'data'):\n"
        "    package = importlib.import_module('airflow_tf.' + room)\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        if info.name != 'airflow_tf.runtime.__main__':\n"
        "            importlib.import_module(info.name)\n"
        "print(airflow_tf.__file__)\n"
    )
    imported = subprocess.run([python, "-c", walk], cwd=cwd, env=env, capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.strip().startswith(str(site)), "the package came from the fresh environment"


def test_compose_builds_the_airflow_image_with_tensorflow_for_its_local_backend():
    """docker-compose runs groups on the local backend inside the Airflow containers, so its
    build of the Airflow image adds TensorFlow; the image's own default stays without it."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    build = compose["x-airflow-common"]["build"]
    assert build["dockerfile"] == "images/airflow/Dockerfile"
    extras = installed_extras(IMAGES["airflow"], build["args"])
    assert {"airflow", "tensorflow"} <= extras
