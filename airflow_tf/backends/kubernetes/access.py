"""A team's namespace and who may run training groups in it (``airflow-tf render --rbac``): the
Namespace, labelled for Pod Security Admission ``restricted`` (enforce, warn and audit), the service
account the team's Airflow workers and triggerer use, the Role of ``airflow_tf/rbac/role.yaml`` (the
one place its rules are written) and the RoleBinding between them. One namespace per team: a team's
account can create, read and delete the groups of its own namespace and nothing of another's."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from airflow_tf.cluster import SpecError

from .pod_options import check_dns_subdomain, check_namespace

ROLE_FILE = Path(__file__).resolve().parents[2] / "rbac" / "role.yaml"
ACCOUNT = "airflow-tf"
"""The service account ``render --rbac`` makes in the namespace (and the Role's and binding's name)."""
POD_SECURITY_LEVEL = "restricted"
POD_SECURITY_MODES = ("enforce", "warn", "audit")
_SUBJECT = re.compile(r"^(?P<namespace>[^:]+):(?P<name>[^:]+)$")


def role(namespace: str) -> dict:
    """The backend's Role (role.yaml), in ``namespace``."""
    body = yaml.safe_load(ROLE_FILE.read_text(encoding="utf-8"))
    body["metadata"]["namespace"] = namespace
    return body


def pod_security_labels() -> dict[str, str]:
    return {label: value for mode in POD_SECURITY_MODES
            for label, value in ((f"pod-security.kubernetes.io/{mode}", POD_SECURITY_LEVEL),
                                 (f"pod-security.kubernetes.io/{mode}-version", "latest"))}


def parse_subject(text: str) -> tuple[str, str]:
    """``NAMESPACE:SERVICEACCOUNT`` as (namespace, name), or a SpecError naming it."""
    match = _SUBJECT.match(text)
    if not match:
        raise SpecError(f"--bind: {text!r} is not NAMESPACE:SERVICEACCOUNT (e.g. airflow:airflow-worker)")
    return (check_namespace(match["namespace"]),
            check_dns_subdomain(match["name"], "--bind", "service account name"))


def team_namespace(namespace: str, bind: list[tuple[str, str]] | None = None) -> list[dict]:
    """The objects of one team's namespace, in the order ``kubectl apply`` needs them. The Role is bound
    to the namespace's own service account ``airflow-tf`` and to each (namespace, service account) of
    ``bind`` (e.g. the team's Airflow workers and triggerer running elsewhere)."""
    check_namespace(namespace)
    labels = {"app.kubernetes.io/name": "airflow-tf"}
    subjects = [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}]
    subjects += [{"kind": "ServiceAccount", "name": name, "namespace": ns} for ns, name in bind or []
                 if (ns, name) != (namespace, ACCOUNT)]
    the_role = role(namespace)
    return [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": namespace, "labels": {**labels, **pod_security_labels()}}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": ACCOUNT, "namespace": namespace, "labels": labels}},
        the_role,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": ACCOUNT, "namespace": namespace, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": the_role["metadata"]["name"]},
         "subjects": subjects},
    ]
