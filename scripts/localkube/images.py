"""The images the nodes' containerd loads: the project's training image as a docker-archive (from
scripts/images, cached by the image's id) and the sandbox's pause image, made from the built pause."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .process import ROOT

def training_image() -> str:
    """The training image as the nodes' containerd knows it, `scripts/images ref training`:
    localhost/airflow-tf-training:VERSION (a name with no registry would mean Docker Hub's)."""
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "images"), "ref", "training"], check=True,
                          capture_output=True, text=True).stdout.strip()


PAUSE_IMAGE = "localhost/airflow-tf-pause:1"


def image_archive(image: str) -> Path:
    """The docker-archive of the project's image ``image`` (scripts/images), cached by the image's id."""
    images = [sys.executable, str(ROOT / "scripts" / "images")]
    ref = subprocess.run([*images, "ref", image], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([*images, "build", image], check=True, stdout=subprocess.DEVNULL)
    env = dict(line.split("=", 1) for line in subprocess.run(
        [*images, "env"], check=True, capture_output=True, text=True).stdout.replace("export ", "").split("\n")
        if "=" in line)
    env = {key: value.strip("'\"") for key, value in env.items()}
    image_id = subprocess.run(["buildah", "images", "--noheading", "--no-trunc", "--format", "{{.ID}}", ref],
                              check=True, capture_output=True, text=True, env={**os.environ, **env}).stdout.split()[0]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "airflow-tf" / "archives"
    archive = base / f"{image}-{image_id.removeprefix('sha256:')[:16]}.tar"
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f"{image}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # planes started side by side write the archive once, one at a time
        if not archive.is_file():
            for old in base.glob(f"{image}-*.tar"):  # one archive per image: the current one
                old.unlink()
            subprocess.run([*images, "archive", image, str(archive)], check=True, stdout=subprocess.DEVNULL)
    return archive


def pause_archive(runtime: Path) -> Path:
    """A docker-archive of PAUSE_IMAGE (one layer: /pause), next to the runtime's binaries."""
    archive = runtime.parent / "pause.tar"
    if archive.is_file():
        return archive
    staging = Path(tempfile.mkdtemp(dir=runtime.parent))
    with tarfile.open(staging / "layer.tar", "w") as layer:
        info = layer.gettarinfo(str(runtime / "pause"), arcname="pause")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        with open(runtime / "pause", "rb") as f:
            layer.addfile(info, f)
    digest = hashlib.sha256((staging / "layer.tar").read_bytes()).hexdigest()
    (staging / "config.json").write_text(json.dumps({
        "architecture": "amd64", "os": "linux", "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]}}))
    (staging / "manifest.json").write_text(json.dumps([{
        "Config": "config.json", "RepoTags": [PAUSE_IMAGE], "Layers": ["layer.tar"]}]))
    with tarfile.open(staging / "pause.tar", "w") as out:
        for name in ("manifest.json", "config.json", "layer.tar"):
            out.add(staging / name, arcname=name)
    (staging / "pause.tar").rename(archive)
    shutil.rmtree(staging)
    return archive
