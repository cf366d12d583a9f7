"""Kueue and the JobSet controller on a plane (``up --kueue``, ``kueue DIR``): their CRDs installed,
both controllers started with their webhooks served but not registered."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .api import api_get, api_send, api_send_yaml, healthy
from .build import CONTROLLERS, JOBSET, KUEUE, build_controller
from .process import free_port, log, openssl, sign, start, wait_for

KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")


def kueue_metrics_certs() -> None:
    """Kueue v0.17.0 without its internal certificate management reads its metrics server's
    certificate from this fixed path, even with the metrics server off, and exits without one: a
    self-signed pair is written there once (nothing serves it) and kept for every plane."""
    if (KUEUE_METRICS_CERTS / "tls.crt").is_file() and (KUEUE_METRICS_CERTS / "tls.key").is_file():
        return
    try:
        KUEUE_METRICS_CERTS.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"kube: Kueue needs a certificate in {KUEUE_METRICS_CERTS} (its metrics server's, fixed "
                         f"in v0.17.0, read even with metrics off) and this user cannot write it ({e}); run once "
                         "as root, or create tls.crt and tls.key there") from None
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.crt", "-days", "3650",
            "-subj", "/CN=kueue-metrics-unused", cwd=KUEUE_METRICS_CERTS)
    log(f"wrote a self-signed certificate for Kueue's metrics server (off) into {KUEUE_METRICS_CERTS}")


def start_kueue(directory: Path) -> None:
    """Install the CRDs of Kueue and JobSet in the plane of DIR and start both controllers.

    Their webhooks are served (on loopback, with a certificate of the plane's CA on disk) but not
    registered with the API server: nothing defaults or validates what is submitted, so manifests
    must be complete as sent (a queued JobSet is created suspended). Kueue manages the Jobs and
    JobSets that name a queue (kueue.x-k8s.io/queue-name); its visibility API server is off."""
    directory = directory.resolve()
    plane = json.loads((directory / "plane.json").read_text())
    if plane.get("kueue"):
        raise SystemExit(f"kube: Kueue and JobSet already run in the plane of {directory}")
    bin_dirs = {name: build_controller(name) for name in CONTROLLERS}
    crds = sorted(crd for bin_dir in bin_dirs.values() for crd in (bin_dir / "crds").glob("*.yaml"))
    started = time.monotonic()
    server, pki = plane["server"], directory / "pki"
    ca, admin = pki / "ca.crt", json.loads((directory / "kubeconfig").read_text())["users"][0]["user"]["token"]
    for crd in crds:
        api_send_yaml(server, ca, admin, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd.read_bytes())

    def established() -> bool:
        listing = api_get(server, ca, admin, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions") or {}
        done = {item["metadata"]["name"] for item in listing.get("items") or []
                if any(c["type"] == "Established" and c["status"] == "True"
                       for c in (item.get("status") or {}).get("conditions") or [])}
        return {f"{crd.stem.split('_', 1)[1]}.{crd.stem.split('_', 1)[0]}" for crd in crds} <= done

    wait_for("the CRDs of Kueue and JobSet", established, directory)
    api_send(server, ca, admin, "/api/v1/namespaces", {"metadata": {"name": "kueue-system"}})
    # One serving certificate for both controllers' webhook servers, which nothing calls.
    certs = pki / "webhook"
    certs.mkdir(mode=0o700)
    sign(pki, "tls", "/CN=airflow-tf-kube-webhooks", "serverAuth", "IP:127.0.0.1,DNS:localhost", into=certs)
    kueue_metrics_certs()
    env = {"KUBECONFIG": str(directory / "kubeconfig")}
    probes = {KUEUE: free_port(), JOBSET: free_port()}
    common = {"leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
              "metrics": {"bindAddress": "0"}}
    (directory / "run" / "jobset.json").write_text(json.dumps({
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration", **common,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probes[JOBSET]}"},
        "webhook": {"host": "127.0.0.1", "port": free_port(), "certDir": str(certs)}}, indent=2) + "\n")
    start(directory, JOBSET, [str(bin_dirs[JOBSET] / JOBSET), f"--config={directory / 'run' / 'jobset.json'}"], env)
    (directory / "run" / "kueue.json").write_text(json.dumps({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": "kueue-system", **common,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probes[KUEUE]}"},
        "webhook": {"host": "127.0.0.1", "port": free_port(), "certDir": str(certs)},
        "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]}}, indent=2) + "\n")
    start(directory, KUEUE, [str(bin_dirs[KUEUE] / KUEUE), f"--config={directory / 'run' / 'kueue.json'}",
                             "--feature-gates=VisibilityOnDemand=false"], env)
    wait_for("JobSet's and Kueue's controllers (their /readyz)", lambda: all(map(healthy, probes.values())),
             directory)
    (directory / "plane.json").write_text(json.dumps({**plane, "kueue": {"crds": [crd.name for crd in crds]}},
                                                     indent=2) + "\n")
    log(f"Kueue and JobSet up in {time.monotonic() - started:.1f} s (webhooks not registered)")
