"""Containers for the tests: the images scripts/images builds here, run by Podman from the same
store (no Docker engine on this machine). Every container a test starts carries a label of its
own, so that a test removes and checks only what it started."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES_SCRIPT = ROOT / "scripts" / "images"
TEST_LABEL = "org.airflow-tf.test"


def _load_images_script():
    """scripts/images as a module: its Dockerfile reading (instructions, from_image, copied) and
    the lock's pins are the tests' too."""
    loader = importlib.machinery.SourceFileLoader("images_script", str(IMAGES_SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    sys.modules[loader.name] = module  # its dataclasses look their module up there
    loader.exec_module(module)
    return module


images_script = _load_images_script()


@functools.cache
def store_env() -> dict[str, str]:
    """The environment under which podman sees the images (``scripts/images env``)."""
    out = subprocess.run([str(IMAGES_SCRIPT), "env"], check=True, capture_output=True, text=True).stdout
    return {name: shlex.split(value)[0] for name, value in
            (line.removeprefix("export ").split("=", 1) for line in out.splitlines())}


def built(*names: str) -> dict[str, str]:
    """The full names of the images ``names``, built first where the store has no current build
    (./scripts/test builds them all before the suite, so this is a check of seconds)."""
    result = subprocess.run([str(IMAGES_SCRIPT), "build", *names], capture_output=True, text=True)
    assert result.returncode == 0, f"scripts/images build {' '.join(names)} failed:\n{result.stderr[-3000:]}"
    refs = {}
    for name in names:
        refs[name] = subprocess.run([str(IMAGES_SCRIPT), "ref", name], check=True, capture_output=True,
                                    text=True).stdout.strip()
    return refs


def podman(*args: str, check: bool = True, timeout: float = 300, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], env={**os.environ, **store_env(), **(env or {})},
                            capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def new_label() -> str:
    """A value of TEST_LABEL that no other test uses."""
    return uuid.uuid4().hex[:12]


def remove_labelled(label: str) -> None:
    """Remove every container the test labelled ``label`` started, running or not."""
    # --depend: a container that shares another's network goes with that one.
    for container in podman("ps", "--all", "--quiet", "--filter", f"label={TEST_LABEL}={label}").stdout.split():
        podman("rm", "--force", "--depend", "--ignore", "--time", "0", container)

