"""One call for the whole training: launch -> wait -> teardown -> evaluate -> export, as an
Airflow task group.

::

    with DAG("my_training", schedule=None):
        prepare = PrepareTFRecordsOperator(task_id="prepare", input="/data/*.csv", name="sales", label="y")
        prepare >> tf_training(dataset=prepare.output, model="my_models:build", steps=3000,
                               thresholds={"mse": {"max": 1.0}}, model_name="sales")
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import TaskGroup, task

from airflow_tf.cluster.training import parse_bool
from airflow_tf.deprecation import renamed
from airflow_tf.cluster.results import EvaluationResult, LaunchResult, best_evaluation
from airflow_tf.operators import (
    EvaluateModelOperator, ExportSavedModelOperator, LaunchTFClusterOperator, TeardownTFClusterOperator,
)
from airflow_tf.sensors import WorkerCompletionSensor

if TYPE_CHECKING:
    from airflow.sdk.definitions.xcom_arg import PlainXComArg

    from airflow_tf.backends.kubernetes import KubernetesPartOptions

    from airflow_tf.operators.approval import ApproveExportOperator

log = logging.getLogger(__name__)


def tf_training(
    group_id: str = "training",
    *,
    dataset: Any,
    model_name: str | None = None,
    thresholds: dict[str, Any] | None = None,
    backend: str | None = None,
    backend_options: dict[str, Any] | None = None,
    expand: dict[str, Any] | None = None,
    select_by: str = "loss",
    max_active_trainings: int | None = None,
    pool: str | None = None,
    compare_to_served: bool = False,
    serving_base: str | None = None,
    on_unblessed: str = "skip",
    deferrable: bool | None = None,
    poke_interval: float = 5.0,
    follow_logs: str | None = "chief",
    timeout: float = 24 * 3600.0,
    launch_retries: int = 2,
    launch_retry_delay: timedelta = timedelta(seconds=5),
    approval: bool = False,
    approval_timeout: timedelta | None = None,
    on_approval_timeout: str = "reject",
    **launch_options: Any,
) -> TaskGroup:
    """Creates the training of one model as a task group and returns it (wire it with ``>>``).

    Inside: ``launch`` -> ``wait_for_workers`` -> ``teardown`` (the launch's teardown: it
    runs on every path) and ``wait_for_workers`` -> ``evaluate`` -> ``export`` (with
    ``approval``: ``evaluate`` -> ``approve`` -> ``export``). Every task uses
    the same backend; task ids come from the objects, so renaming nothing breaks anything.

    A training that fails, times out (``timeout``) or whose run is marked failed or cancelled
    while it trains makes the DAG run fail: the teardown tears the group down and then fails,
    and it counts for the run's state (``on_failure_fail_dagrun``). The launch retries
    (``launch_retries``): a retried launch re-attaches to the group it started.

    With ``expand`` (e.g. ``{"learning_rate": [0.01, 0.03]}``) the launch, wait and evaluation
    are mapped, one training group and run directory per value; ``select_best`` picks the
    best blessed run by ``select_by`` and only that one is exported.

    :param group_id: the task group's id (its tasks are ``<group_id>.launch``, ...).
    :param dataset: dataset directory, or the prepare task's XCom (``prepare.output``).
    :param model_name: the exported model's name; None: no export task.
    :param thresholds: blessing thresholds, e.g. ``{"mse": {"max": 1.0}}``.
    :param backend: ``local`` or ``kubernetes``, for every task of the group; None (default): the
        deployment's, ``[airflow_tf] backend`` (``$AIRFLOW_TF_BACKEND``), else ``local``.
    :param backend_options: the backend's options, for every task of the group; None: for the
        deployment's backend, ``[airflow_tf] backend_options`` (a JSON object).
    :param expand: launch options mapped over (Airflow dynamic task mapping).
    :param select_by: with ``expand``: the eval metric that picks the run to export (lower
        is better for losses and errors, higher otherwise).
    :param max_active_trainings: with ``expand``: how many mapped launches and waits run at once.
    :param pool: the Airflow pool of the launch and the wait. With a pool that counts deferred
        tasks (``include_deferred``), its slots bound the trainings running at once across every
        DAG run that uses it; the others queue in Airflow until a slot frees.
    :param compare_to_served: bless only a model at least as good as the one served.
    :param serving_base: where exported models live; default ``<storage>/models``.
    :param on_unblessed: ``skip`` (default) or ``fail`` the export of an unblessed model.
    :param deferrable: wait on the triggerer; default ``[operators] default_deferrable``.
    :param poke_interval: seconds between status reads of the wait.
    :param follow_logs: the task whose log the wait's task log follows as it is written
        (``chief``, ``<role>-<index>``, or None: none); see the sensor.
    :param timeout: seconds the wait may last before the training counts as failed.
    :param launch_retries: retries of the launch (each re-attaches to the group).
    :param launch_retry_delay: delay before a retry of the launch.
    :param approval: a person approves the export first (``approve`` between evaluation and
        export, an :class:`~airflow_tf.operators.approval.ApproveExportOperator`; Airflow 3.1 or
        later): approve exports, reject ends the run without a new version. Needs ``model_name``.
    :param approval_timeout: how long the approval waits; None: until someone answers.
    :param on_approval_timeout: no answer in time means ``reject`` (default), ``approve`` or ``fail``.
    :param launch_options: the options of :class:`~airflow_tf.operators.LaunchTFClusterOperator`
        (``model``, ``steps``, ``learning_rate``, ``ps``, ``workers``, ``sync``, ...).
    """
    backend_options = None if backend_options is None else dict(backend_options)
    approve_class: type[ApproveExportOperator] | None = None
    if parse_bool(approval, "approval"):
        if model_name is None:
            raise ValueError("approval=True needs model_name= (approval is of the export, and there is no export)")
        from airflow_tf.operators.approval import ApproveExportOperator as approve_class
    wait_options: dict[str, Any] = {"poke_interval": poke_interval, "timeout": timeout, "follow_logs": follow_logs}
    if deferrable is not None:
        wait_options["deferrable"] = deferrable
    pooled: dict[str, Any] = {"pool": pool} if pool else {}
    mapped = {"max_active_tis_per_dagrun": max_active_trainings} if expand and max_active_trainings else {}

    # Each an operator, or a mapped operator when the launch is expanded over a sweep.
    launch: Any
    wait: Any
    evaluate: Any
    with TaskGroup(group_id=group_id) as group:
        launch_args = dict(task_id="launch", dataset=dataset, backend=backend, backend_options=backend_options,
                           retries=launch_retries, retry_delay=launch_retry_delay, **pooled, **launch_options)
        if expand:
            launch = LaunchTFClusterOperator.partial(**launch_args, **mapped).expand(**expand)
            wait = WorkerCompletionSensor.partial(task_id="wait_for_workers", **wait_options, **pooled, **mapped).expand(
                group=launch.output)
            evaluate = EvaluateModelOperator.partial(
                task_id="evaluate", thresholds=thresholds, compare_to_served=compare_to_served,
                serving_base=serving_base, model_name=model_name,
            ).expand(launch=launch.output)
        else:
            launch = LaunchTFClusterOperator(**launch_args)
            wait = WorkerCompletionSensor(task_id="wait_for_workers", group=launch.output, **wait_options, **pooled)
            evaluate = EvaluateModelOperator(
                task_id="evaluate", launch=launch.output, thresholds=thresholds,
                compare_to_served=compare_to_served, serving_base=serving_base, model_name=model_name,
            )
        teardown = TeardownTFClusterOperator(task_id="teardown", group=launch.output, launch=launch, wait=wait,
                                             backend=backend, backend_options=backend_options)
        # The teardown is a leaf that counts for the run's state: a training that did not
        # complete fails the run even when marking it failed skipped evaluate and export.
        launch >> wait >> teardown.as_teardown(setups=launch, on_failure_fail_dagrun=True)
        wait >> evaluate

        if model_name is not None:
            if expand:
                # multiple_outputs: a plain XComArg, whose keys are the returned dict's
                best = cast("PlainXComArg",
                            select_best.override(task_id="select_best")(evaluate.output, launch.output, select_by))
                export_launch, export_metrics = best["launch"], best["evaluation"]
            else:
                export_launch, export_metrics = launch.output, evaluate.output
            export = ExportSavedModelOperator(task_id="export", launch=export_launch, metrics=export_metrics,
                                              model_name=model_name, serving_base=serving_base,
                                              on_unblessed=on_unblessed)
            if approve_class is not None:
                approve = approve_class(task_id="approve", evaluation=export_metrics, model_name=model_name,
                                        candidates=evaluate.output if expand else None,
                                        response_timeout=approval_timeout, on_timeout=on_approval_timeout)
                evaluate >> approve >> export
            else:
                evaluate >> export
    return group


def tf_prepare(
    group_id: str = "prepare",
    *,
    input: Any,
    name: str,
    parts: int = 2,
    output: str | None = None,
    encode_threads: int | None = None,
    progress_every: float = 5.0,
    kubernetes: KubernetesPartOptions | dict[str, Any] | None = None,
    partitions: int | None = None,
    workers: int | None = None,
    **options: Any,
) -> TaskGroup:
    """One dataset version prepared by ``parts`` parallel tasks, as a task group.

    Inside: ``plan`` (checks the options, decides the schema, gives each part a share of the
    input files) -> ``part`` (mapped: one task per share, run in parallel) -> ``commit`` (checks
    every part and commits them as one version, ``_SUCCESS`` last). A failed part fails the
    group and nothing is committed; its parts' files are removed a day later by the next
    prepare of the dataset (or re-run the failed part, then ``commit``). The version holds
    exactly the records per split that one :class:`~airflow_tf.operators.PrepareTFRecordsOperator`
    would write. ``group.output`` is the commit's summary (the same XCom as the operator's):
    pass it as the training's ``dataset``. The commit updates the dataset's asset.

    :param input: files, a directory, a glob or a list of those; the parts split them by file.
    :param name: dataset name.
    :param parts: parallel parts (at most one per input file).
    :param output: datasets directory; default ``<storage>/datasets``.
    :param encode_threads: each part's encoding threads (default: the cores this process may use,
        within its CPU limit).
    :param progress_every: seconds between progress lines of each part.
    :param kubernetes: run each part as a Kubernetes Job (one pod per part) instead of in the
        Airflow worker, which then only waits and shows the part's log:
        :class:`~airflow_tf.backends.kubernetes.KubernetesPartOptions` or a dict of it
        (``image``, ``namespace``, ``kubernetes_conn_id``, ``resources``, ``env``, and pod
        settings such as ``volumes``, ``node_selector``, ``service_account``, ``secret_env``).
        The pods must mount the storage ``output`` is on at the same path (a shared volume).
    :param options: the other options of the operator (``label``, ``eval_fraction``, ``seed``,
        ``split_key``, ``shards``, ``target_shard_mib``, ``compression``, ``schema``,
        ``string_columns``, ``allow_nan``, ``vocabularies``, ``buffer_mib``, ``overwrite``,
        ``version``), with their defaults (:class:`~airflow_tf.data.options.PrepareOptions`).
    :param partitions: deprecated since 0.2.0, removed in 0.3.0: ``parts``.
    :param workers: deprecated since 0.2.0, removed in 0.3.0: ``encode_threads``.
    """
    from airflow_tf.backends.kubernetes import KubernetesPartOptions
    from airflow_tf.operators.common import dataset_asset, is_template
    from airflow_tf.operators.prepare import PreparePartOperator
    from airflow_tf.storage import datasets_dir

    parts = renamed("tf_prepare", "partitions", "parts", partitions, parts, unset=2)
    encode_threads = renamed("tf_prepare", "workers", "encode_threads", workers, encode_threads)
    if "target_shard_mb" in options:
        options["target_shard_mib"] = renamed("tf_prepare", "target_shard_mb", "target_shard_mib",
                                              options.pop("target_shard_mb"), options.get("target_shard_mib"))
    outlets = [] if is_template(name) else [dataset_asset(name)]
    # Checked while the DAG is parsed: a bad setting is an import error naming it.
    pods = None if kubernetes is None else KubernetesPartOptions.coerce(kubernetes).to_dict()
    _check_prepare_options(options)

    with TaskGroup(group_id=group_id) as group:

        @task(task_id="plan")
        def plan(input: Any, name: str, parts: Any, output: str | None, options: dict[str, Any]) -> list[dict]:
            from airflow_tf.data.parts import plan_parts

            made = plan_parts(input, output or datasets_dir(), name, parts, **options)
            log.info("Dataset %r: %d parts over %d files (%s rows expected), in %s", name, len(made["parts"]),
                     len(made["files"]), f"{made['estimated_rows']:,}", made["directory"])
            return [{"plan": made["directory"], "index": i, "name": made["name"], "token": made["token"]}
                    for i in range(len(made["parts"]))]

        @task(task_id="commit", outlets=outlets)
        def commit(jobs: Any) -> dict[str, Any]:  # the plan's jobs (an XComArg while the DAG is built)
            from airflow.sdk import get_current_context

            from airflow_tf.data.parts import commit_parts

            summary = commit_parts(jobs[0]["plan"])
            log.info("Dataset %s committed from %d parts: %s examples (%s)", summary["dataset_uri"],
                     summary["parts"], summary["rows"],
                     ", ".join(f"{split} {count}" for split, count in summary["counts"].items()))
            if outlets:
                get_current_context()["outlet_events"][outlets[0]].extra = {
                    "version": summary["version"], "path": summary["dataset_uri"], "rows": summary["rows"],
                    "counts": summary["counts"],
                }
            return summary

        jobs = plan(input, name, parts, output, options)
        written = PreparePartOperator.partial(task_id="part", encode_threads=encode_threads,
                                              progress_every=progress_every, kubernetes=pods).expand(job=jobs)
        summary = commit(jobs)
        written >> summary
    group.output = summary  # type: ignore[attr-defined]
    return group


# plan_parts' own arguments beside the prepare options.
_PLAN_ARGUMENTS = ("version", "overwrite")


def _check_prepare_options(options: dict[str, Any]) -> None:
    """``tf_prepare``'s options as the plan will check them: an unknown name, or a plain value the
    plan would refuse, fails the DAG's import naming it. Templates and XComArgs are checked when
    the plan runs (unset here stands for the default)."""
    from airflow_tf.data.options import PrepareOptions
    from airflow_tf.operators.common import flag, is_template

    if "overwrite" in options:
        flag(options["overwrite"], "overwrite")
    PrepareOptions.given(None, "tf_prepare", {name: None if is_template(value) else value for name, value in options.items()
                                               if name not in _PLAN_ARGUMENTS})


@task(multiple_outputs=True)
def select_best(evaluations: Any, launches: Any, metric: str) -> dict[str, Any]:
    """The best blessed run of a sweep by ``metric``: its launch and evaluation results."""
    evaluations, launches = list(evaluations), [LaunchResult.from_dict(x) for x in launches]
    best = EvaluationResult.from_dict(evaluations[best_evaluation(evaluations, metric)])
    for result in evaluations:
        run = EvaluationResult.from_dict(result)
        log.info("%s: %s = %s, blessed %s", run.run_dir, metric, run.metrics.get(metric), run.blessed)
    launch = next(x for x in launches if os.path.realpath(x.run_dir) == os.path.realpath(best.run_dir))
    log.info("best run: %s (%s = %s, learning rate %s)", best.run_dir, metric, best.metric(metric),
             launch.training.get("learning_rate"))
    return {"launch": launch.to_dict(), "evaluation": best.to_dict()}
