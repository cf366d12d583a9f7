"""The plane's binaries built once from the Go modules under kube/ into a cache outside the repo,
keyed on each module's go.mod, go.sum and sources: the control plane and the kubelet (kube/), the
container runtime (kube/containerd), Kueue and JobSet (kube/kueue, kube/jobset)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .process import ROOT, log

MODULE = ROOT / "kube"
COMPONENTS = {  # binary name: the package it is built from
    "etcd": "./etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "coredns": "github.com/coredns/coredns",
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
}
# The container runtime of the real nodes (up --nodes N), from a module of its own (kube/containerd:
# containerd needs other versions of gRPC and the Kubernetes API modules than the plane): binary
# name: (package, its build tags, whether cgo is off). pause is the sandbox image's only program.
RUNTIME_MODULE = MODULE / "containerd"
RUNTIME = {
    "containerd": ("github.com/containerd/containerd/v2/cmd/containerd", "urfave_cli_no_docs no_btrfs no_devmapper no_zfs", False),
    "ctr": ("github.com/containerd/containerd/v2/cmd/ctr", "urfave_cli_no_docs no_btrfs no_devmapper no_zfs", False),
    "containerd-shim-runc-v2": ("github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2", "no_grpc", True),
    "pause": ("./pause", "", True),
}
# Kueue and the JobSet controller (up --kueue) each come from a module of their own, kube/kueue and
# kube/jobset: a module builds against one version of each dependency, and Kueue v0.17.0 builds
# only against the Kubernetes API modules v0.35 and controller-runtime v0.23, JobSet v0.11.1 only
# against controller-runtime v0.22, the plane (kube/go.mod) only against v0.37.
KUEUE, JOBSET = "kueue", "jobset-controller"
CONTROLLERS = {  # binary name: its module, the package it is built from, the module holding its CRDs
    KUEUE: (MODULE / "kueue", "sigs.k8s.io/kueue/cmd/kueue", "sigs.k8s.io/kueue"),
    JOBSET: (MODULE / "jobset", "sigs.k8s.io/jobset", "sigs.k8s.io/jobset"),
}
CRD_DIR = "config/components/crd/bases"  # in both modules


def kubernetes_version() -> str:
    match = re.search(r"^require k8s\.io/kubernetes (v\S+)(?: // indirect)?$", (MODULE / "go.mod").read_text(), re.M)
    if not match:
        raise SystemExit(f"kube: {MODULE / 'go.mod'} does not require k8s.io/kubernetes on a line of its own")
    return match.group(1)


def cache_dir(module: Path = MODULE, flags: str = "") -> Path:
    """The build's cache, keyed on the module's go.mod, go.sum and sources (a nested module's
    are its own), and on ``flags``, the build's own."""
    digest = hashlib.sha256(flags.encode())
    nested = [p.parent for p in module.rglob("go.mod") if p.parent != module]
    sources = sorted(p.relative_to(module).as_posix() for p in module.rglob("*.go")
                     if not p.name.endswith("_test.go") and not any(n in p.parents for n in nested))
    for name in ("go.mod", "go.sum", *sources):
        digest.update(name.encode() + b"\0" + (module / name).read_bytes())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "airflow-tf" / ("kube" if module == MODULE else f"kube-{module.name}") / digest.hexdigest()[:16]


def build() -> Path:
    """The bin dir holding the binaries of COMPONENTS, built first if this go.mod/go.sum has none yet."""
    cache = cache_dir()
    bin_dir = cache / "bin"
    if all((bin_dir / name).is_file() for name in COMPONENTS):
        return bin_dir
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second caller waits for the first build, then uses it
        if all((bin_dir / name).is_file() for name in COMPONENTS):
            return bin_dir
        if not shutil.which("go"):
            raise SystemExit("kube: building the control plane needs Go 1.26 or newer (https://go.dev/dl/) on PATH")
        version = kubernetes_version()
        major, minor = version.lstrip("v").split(".")[:2]
        # Without the version stamped in, the server reports v0.0.0-master, which clients
        # that parse versions refuse.
        stamp = " ".join(
            f"-X {package}.{key}={value}"
            for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
            for key, value in (("gitVersion", version), ("gitMajor", major), ("gitMinor", minor),
                               ("gitTreeState", "clean")))
        staging = Path(tempfile.mkdtemp(prefix="bin.", dir=cache))
        log(f"building Kubernetes {version}, etcd and CoreDNS from {MODULE} (7 to 13 minutes on 2 cores, once)")
        start = time.monotonic()
        subprocess.run(["go", "build", "-trimpath", f"-ldflags=-s -w {stamp}", "-o", f"{staging}/",
                        *COMPONENTS.values()], cwd=MODULE, check=True)
        for name, package in COMPONENTS.items():  # go build names a binary after its package's directory
            if package.rsplit("/", 1)[-1] != name:
                (staging / package.rsplit("/", 1)[-1]).rename(staging / name)
        staging.rename(bin_dir)
        log(f"built in {time.monotonic() - start:.0f} s into {bin_dir}")
    return bin_dir


def build_runtime() -> Path:
    """The bin dir holding containerd, ctr, the runc shim and pause (RUNTIME), built first if
    kube/containerd's go.mod/go.sum/sources have none yet."""
    match = re.search(r"^\s*github\.com/containerd/containerd/v2 (v\S+)", (RUNTIME_MODULE / "go.mod").read_text(), re.M)
    if not match:
        raise SystemExit(f"kube: {RUNTIME_MODULE / 'go.mod'} does not require github.com/containerd/containerd/v2")
    # Stamped as a release build is: the nodes report containerd://2.4.2, not 2.4.2+unknown.
    stamp = f"-X github.com/containerd/containerd/v2/version.Version={match.group(1)}"
    cache = cache_dir(RUNTIME_MODULE, stamp)
    bin_dir = cache / "bin"
    if all((bin_dir / name).is_file() for name in RUNTIME):
        return bin_dir
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((bin_dir / name).is_file() for name in RUNTIME):
            return bin_dir
        if not shutil.which("go"):
            raise SystemExit("kube: building containerd needs Go 1.26 or newer (https://go.dev/dl/) on PATH")
        staging = Path(tempfile.mkdtemp(prefix="bin.", dir=cache))
        log(f"building containerd, its runc shim and pause from {RUNTIME_MODULE} (about 8 minutes on 2 cores, once)")
        start = time.monotonic()
        for name, (package, tags, static) in RUNTIME.items():
            subprocess.run(["go", "build", "-trimpath", f"-ldflags=-s -w {stamp}", f"-tags={tags}", "-o", str(staging / name),
                            package], cwd=RUNTIME_MODULE, check=True,
                           env={**os.environ, **({"CGO_ENABLED": "0"} if static else {})})
        staging.rename(bin_dir)
        log(f"built the container runtime in {time.monotonic() - start:.0f} s into {bin_dir}")
    return bin_dir


def build_controller(name: str) -> Path:
    """The bin dir holding the controller ``name`` of CONTROLLERS and, in crds/, its CRDs (from the
    very module version built), built first if its module's go.mod/go.sum has none yet."""
    module, package, crd_module = CONTROLLERS[name]
    cache = cache_dir(module)
    bin_dir = cache / "bin"
    if (bin_dir / name).is_file():
        return bin_dir
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (bin_dir / name).is_file():
            return bin_dir
        if not shutil.which("go"):
            raise SystemExit(f"kube: building {name} needs Go 1.26 or newer (https://go.dev/dl/) on PATH")
        staging = Path(tempfile.mkdtemp(prefix="bin.", dir=cache))
        log(f"building {name} from {module} (1 to 4 minutes on 2 cores once the plane is built, once)")
        start = time.monotonic()
        subprocess.run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(staging / name), package],
                       cwd=module, check=True)
        (staging / "crds").mkdir()
        source = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", crd_module], cwd=module, check=True,
                                capture_output=True, text=True).stdout.strip()
        for crd in sorted(Path(source, CRD_DIR).glob("*.yaml")):
            shutil.copyfile(crd, staging / "crds" / crd.name)
        staging.rename(bin_dir)
        log(f"built {name} in {time.monotonic() - start:.0f} s into {bin_dir}")
    return bin_dir
