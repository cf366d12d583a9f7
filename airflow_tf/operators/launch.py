"""LaunchTFClusterOperator: starts (or re-attaches to) a parameter-server/worker group."""

from __future__ import annotations

import os
from typing import Any, Sequence

from airflow.sdk import BaseOperator

from airflow_tf.backends import GroupRef, backend_for, get_backend
from airflow_tf.cluster import GroupSpec, TrainingConfig, group_name, label_value
from airflow_tf.cluster.training import dataset_uri_of
from airflow_tf.storage import runs_dir


class LaunchTFClusterOperator(BaseOperator):
    """Launches a TensorFlow training group and returns (XCom) its reference.

    The group name derives from the dag id, task id and run id, so a retry or second try of
    this task finds the group it already launched and re-attaches instead of starting another.

    :param dataset: dataset directory, or the prepare task's XCom (``prepare.output``).
    :param run_dir: checkpoints and event files; default ``<storage>/runs/<group>`` (see airflow_tf.storage).
    :param ps: parameter-server tasks; :param workers: worker tasks; :param chief: 0 or 1.
    :param sync: synchronous updates (``SyncReplicasOptimizer``) instead of asynchronous.
    :param backend: ``local`` (processes on this machine) or ``kubernetes``.
    :param backend_options: e.g. ``{"state_dir": ...}`` for local, or ``{"kubernetes_conn_id": ...,
        "namespace": ...}`` for kubernetes.
    :param role_options: per role ``RoleSpec`` fields: ``{"worker": {"resources": {...}}}``.
    Other keyword arguments of :class:`~airflow_tf.cluster.TrainingConfig` (model, steps, epochs,
    batch_size, learning_rate, optimizer, loss, model_kwargs, replicas_to_aggregate,
    warm_start_from, ...) are passed through as ``training``.
    """

    template_fields: Sequence[str] = ("dataset", "run_dir", "training", "backend_options", "image", "group_name")
    template_fields_renderers = {"training": "json", "backend_options": "json"}
    ui_color = "#ffcc80"

    def __init__(self, *, dataset: Any, run_dir: str | None = None, ps: int = 1, workers: int = 2,
                 chief: int = 0, sync: bool = False, backend: str = "local",
                 backend_options: dict[str, Any] | None = None, image: str | None = None,
                 role_options: dict[str, dict[str, Any]] | None = None, backoff_limit: int = 3,
                 active_deadline_seconds: float | None = None, success_policy: str = "AllWorkers",
                 port: int = 2222, group_name: str | None = None, training: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        training_keys = set(TrainingConfig.__dataclass_fields__) - {"dataset", "run_dir", "sync"}
        training = dict(training or {})
        for key in list(kwargs):
            if key in training_keys:
                training[key] = kwargs.pop(key)
        super().__init__(**kwargs)
        self.dataset = dataset
        self.run_dir = run_dir
        self.ps, self.workers, self.chief, self.sync = ps, workers, chief, sync
        self.backend = backend
        self.backend_options = backend_options or {}
        self.image = image
        self.role_options = role_options or {}
        self.backoff_limit = backoff_limit
        self.active_deadline_seconds = active_deadline_seconds
        self.success_policy = success_policy
        self.port = port
        self.group_name = group_name
        self.training = training

    def build_spec(self, context: Any) -> GroupSpec:
        ti = context["ti"]
        name = self.group_name or group_name(ti.dag_id, ti.task_id, ti.run_id)
        run_dir = self.run_dir or os.path.join(runs_dir(), name)
        config = TrainingConfig(dataset=dataset_uri_of(self.dataset), run_dir=run_dir, sync=self.sync, **self.training)
        labels = {
            "airflow.dag_id": label_value(ti.dag_id),
            "airflow.task_id": label_value(ti.task_id),
            "airflow.run_id": label_value(ti.run_id),
            "airflow.try_number": str(ti.try_number),
        }
        return GroupSpec.for_training(
            name, config, ps=self.ps, workers=self.workers, chief=self.chief, image=self.image,
            role_options=self.role_options, backoff_limit=self.backoff_limit,
            active_deadline_seconds=self.active_deadline_seconds, success_policy=self.success_policy,
            port=self.port, labels=labels,
        )

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.build_spec(context)
        backend = get_backend(self.backend, **self.backend_options)
        existing = backend.find(spec.name)
        # launch() is idempotent: on a retry it re-attaches, creating only what an interrupted
        # first try left missing.
        ref = backend.launch(spec)
        if existing is not None:
            self.log.info("re-attaching to training group %s launched by an earlier try", spec.name)
        else:
            self.log.info("launched training group %s on %s: %s", spec.name, self.backend,
                          ", ".join(f"{spec.replicas(r)} {r}" for r in spec.roles if spec.replicas(r)))
        self._launched = ref
        assert spec.training is not None
        if spec.training.warm_start_from:
            self.log.info("warm start: the model begins from checkpoint %s", spec.training.warm_start_from)
        return {
            "group": ref.to_dict(),
            "run_dir": spec.training.run_dir,
            "dataset": spec.training.dataset,
            "training": spec.training.to_dict(),
            "reattached": existing is not None,
        }

    def on_kill(self) -> None:
        ref: GroupRef | None = getattr(self, "_launched", None)
        if ref is not None:
            backend_for(ref).teardown(ref)
            self.log.info("launch killed: tore down group %s", ref.name)

