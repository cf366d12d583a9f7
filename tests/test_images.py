"""The container images: every file the Dockerfiles copy exists, the base images match the
versions the project pins, the training image runs the command the backends give their tasks,
and the installs keep Airflow and TensorFlow apart. Then the images themselves, built here by
scripts/images with buildah (no Docker engine here) and run by Podman: the training image trains
as uid 1000 with no Airflow importable, the Airflow image imports the provider with no TensorFlow."""

from __future__ import annotations

import json
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

import containers
import pytest
import yaml
from packaging.requirements import Requirement

from airflow_tf.backends.kubernetes.pod_options import DEFAULT_USER
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.cluster.spec import RUNTIME_COMMAND
from airflow_tf.cluster.tf_config import tf_config_json

ROOT = Path(__file__).resolve().parents[1]
IMAGES = {name: ROOT / "images" / name / "Dockerfile" for name in ("training", "training-gpu", "airflow")}
TRAINING_IMAGES = ("training", "training-gpu")


# How scripts/images reads a Dockerfile (its build hashes what COPY reads, and finds each base).
instructions = containers.images_script.instructions
copy_sources = containers.images_script.copied
base_image = containers.images_script.from_image
pinned = containers.images_script.pinned


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


def test_the_training_images_install_brings_no_airflow():
    """What `pip install ".[tensorflow]"` in images/training brings, by the installed metadata
    (the built image is run below)."""
    core = installed_distributions(installed_extras(IMAGES["training"]))
    assert "tensorflow" in core and not any(n.startswith("apache-airflow") for n in core)


def test_compose_builds_the_airflow_image_with_tensorflow_for_its_local_backend():
    """docker-compose runs groups on the local backend inside the Airflow containers, so its
    build of the Airflow image adds TensorFlow; the image's own default stays without it."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    build = compose["x-airflow-common"]["build"]
    assert build["dockerfile"] == "images/airflow/Dockerfile"
    extras = installed_extras(IMAGES["airflow"], build["args"])
    assert {"airflow", "tensorflow"} <= extras


# -- the images themselves, built here by scripts/images (buildah) and run by Podman --------------
# Docker Hub is out of reach here: the public bases are stand-ins built from Debian's packages
# under the public names (images/stand-ins/, docs/how-to/develop.md); the project's Dockerfiles
# are built as they are.
EVERY_RUNTIME_MODULE = (
    "import importlib, pkgutil, airflow_tf\n"
    "for room in ('runtime', 'cluster', 'data'):\n"
    "    package = importlib.import_module('airflow_tf.' + room)\n"
    "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
    "        if info.name != 'airflow_tf.runtime.__main__':\n"
    "            importlib.import_module(info.name)\n"
)


@pytest.fixture
def label():
    value = containers.new_label()
    yield value
    containers.remove_labelled(value)


@pytest.mark.slow
def test_the_built_training_image_trains_as_uid_1000_with_no_airflow(linear_dataset, tmp_path, label):
    """A ps and a worker from the built training image, each in a container of its own started as
    the Kubernetes backend starts its pods (the image's entrypoint is the task command; only the
    training flags and TF_CONFIG are given), talking gRPC over a network namespace of their own
    with nothing but loopback, train to the final step on a mounted run directory."""
    image = containers.built("training")["training"]
    dataset_root = Path(linear_dataset).parent
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chown(run_dir, DEFAULT_USER, DEFAULT_USER)
    config = TrainingConfig(dataset=linear_dataset, run_dir=str(run_dir), steps=200, batch_size=32,
                            learning_rate=0.1, checkpoint_every_secs=1.0, log_every_secs=0.5)
    spec = GroupSpec.for_training("image-check", config, ps=1, workers=1)
    assert spec.command("worker")[:3] == list(RUNTIME_COMMAND)
    cluster = {"ps": ["localhost:2222"], "worker": ["localhost:2223"]}
    mounts = ["--volume", f"{dataset_root}:{dataset_root}:ro", "--volume", f"{run_dir}:{run_dir}"]

    def start(role: str, *network: str, detach: bool) -> subprocess.CompletedProcess[str]:
        return containers.podman(
            "run", *(["--detach"] if detach else []), "--name", f"{label}-{role}", "--label",
            f"{containers.TEST_LABEL}={label}", *network, *mounts,
            "--env", f"TF_CONFIG={tf_config_json(cluster, role, 0)}", image, *spec.command(role)[3:],
            check=False, timeout=240)

    ps = start("ps", "--network", "none", detach=True)
    assert ps.returncode == 0, ps.stderr
    worker = start("worker", "--network", f"container:{label}-ps", detach=False)
    ps_log = containers.podman("logs", f"{label}-ps").stderr
    assert worker.returncode == 0, f"the worker failed:\n{worker.stderr[-3000:]}\nps:\n{ps_log[-2000:]}"

    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["done"] and progress["global_step"] >= 200, progress
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert written and {p.stat().st_uid for p in written} == {DEFAULT_USER}, "the tasks wrote as uid 1000"
    ps_process = containers.podman("inspect", "--format", "{{.State.Pid}}", f"{label}-ps").stdout.strip()
    uids = Path(f"/proc/{ps_process}/status").read_text().split("Uid:")[1].split()[:4]
    assert uids == [str(DEFAULT_USER)] * 4, f"the ps runs as uids {uids}"

    # No Airflow in the image, and every module the runtime may use imports without it.
    probe = containers.podman("run", "--rm", "--network", "none", "--label", f"{containers.TEST_LABEL}={label}",
                              "--entrypoint", "python", image, "-c",
                              EVERY_RUNTIME_MODULE + "import importlib.util, os\n"
                              "print(os.getuid(), importlib.util.find_spec('airflow'))\n")
    assert probe.stdout.split() == [str(DEFAULT_USER), "None"]


@pytest.mark.slow
def test_the_built_airflow_image_has_the_provider_and_no_tensorflow(label):
    image = containers.built("airflow")["airflow"]
    probe = containers.podman(
        "run", "--rm", "--network", "none", "--label", f"{containers.TEST_LABEL}={label}", image, "python", "-c",
        "import importlib.util\n"
        "import airflow_tf.operators, airflow_tf.sensors, airflow_tf.triggers, airflow_tf.backends.kubernetes\n"
        "from airflow.providers_manager import ProvidersManager\n"
        "print(importlib.util.find_spec('tensorflow'), importlib.util.find_spec('keras'))\n"
        "print('airflow-tf' in ProvidersManager().providers)\n")
    assert probe.stdout.split() == ["None", "None", "True"], probe.stdout
    version = containers.podman("run", "--rm", "--network", "none", "--label", f"{containers.TEST_LABEL}={label}",
                                image, "version")
    assert version.stdout.strip() == pinned("apache-airflow"), "the entrypoint runs Airflow's commands"
