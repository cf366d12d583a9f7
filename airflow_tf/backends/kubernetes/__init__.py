"""The Kubernetes backend: a training group as Kubernetes objects, run by Kubernetes' own
controllers, also while no Airflow component runs.

- :mod:`.backend`: :class:`KubernetesBackend` (launch, status, logs, teardown); :mod:`.watch`:
  its ``watch()``; :mod:`.one_off`: its one-off Jobs (evaluation, export, a prepare's parts);
  :mod:`.calls`: what its sync calls and its async watch share.
- :mod:`.workloads`: the workload forms (the backend option ``workload``): :mod:`.jobs`, one
  Indexed Job per role (the default), and :mod:`.jobset`, the group as one JobSet (the form a
  Kueue queue needs); :mod:`.manifests`: what a task's pod holds whatever the form;
  :mod:`.pod_options`: the validated pod settings.
- :mod:`.status`: a group's status read from its Jobs and pods.
- :mod:`.parts`: a prepare's parts as one-off Jobs (:class:`KubernetesPartOptions`).
"""

from .backend import KubernetesBackend
from .parts import KubernetesPartOptions

__all__ = ["KubernetesBackend", "KubernetesPartOptions"]
