"""PrepareTFRecordsOperator: raw CSV/Parquet/.npz files -> a committed TFRecord dataset."""

from __future__ import annotations

import logging
from typing import Any, ClassVar
from collections.abc import Sequence

from airflow.sdk import BaseOperator

from airflow_tf.cluster.training import is_unset, parse_bool
from airflow_tf.data.options import DEFAULTS, PrepareOptions, prepare_parameter_docs
from airflow_tf.deprecation import renamed
from airflow_tf.storage import datasets_dir

from .common import check_name, dataset_asset, flag, is_template, no_retry_for
from .lineage import LineageMethods, prepare_lineage


def _optional(value: Any, kind: type) -> Any:
    """A rendered template arrives as text: '' and 'None' mean unset, numbers are parsed."""
    if is_unset(value):
        return None
    return kind(value)


log = logging.getLogger(__name__)
# The operator's attribute of a prepare option, where it is not the option's name: BaseOperator has a ``label``.
_ATTRIBUTES = {"label": "label_column"}


def emit_partition(event: Any, key: str) -> bool:
    """Attach ``key`` to an outlet asset event as its Airflow partition key (asset partitions,
    Airflow 3.2+). On an older Airflow, log that only the event's extra carries it."""
    if hasattr(event, "add_partitions"):  # the partition API of Airflow 3.2+
        event.add_partitions(key)
        return True
    import airflow

    log.info("Airflow %s has no asset partitions (3.2 or later needed): the dataset event carries "
             "partition %r in its extra only", airflow.__version__, key)
    return False


def storage_options(aws_conn_id: str | None, gcp_conn_id: str | None) -> dict[str, dict[str, Any]] | None:
    """pyarrow file system options for ``s3://`` and ``gs://`` from Airflow connections (read
    directly: neither the Amazon nor the Google provider is needed); None: the environment's
    own credentials. The result holds secrets: it is passed on, never logged."""
    from airflow.sdk import BaseHook

    from airflow_tf.data.object_store import gcs_options, s3_options

    options: dict[str, dict[str, Any]] = {}
    if aws_conn_id:
        conn = BaseHook.get_connection(aws_conn_id)
        options["s3"] = s3_options(conn.login, conn.password, conn.extra_dejson, aws_conn_id)
    if gcp_conn_id:
        options["gs"] = gcs_options(BaseHook.get_connection(gcp_conn_id).extra_dejson, gcp_conn_id)
    return options or None


class PrepareTFRecordsOperator(LineageMethods, BaseOperator):
    """Converts CSV, Parquet or NumPy ``.npz`` files into a sharded TFRecord dataset version
    (``<output>/<name>/<version>/{train,eval}/part-*.tfrecord``, ``schema.json``, ``_SUCCESS``)
    and returns (XCom) ``{"dataset_uri", "schema", "counts", ...}``, which the launch,
    evaluate and export operators accept as their ``dataset``.

    The options are those of ``airflow-tf prepare``; every one is templated.

    Each committed version updates the asset ``airflow_tf.dataset.<name>`` (extra: ``version``,
    ``path``, ``rows``, ``counts``): a training DAG can be scheduled on new data
    (``schedule=[dataset_asset("...")]``, from ``airflow_tf.operators``).

    :param input: a file, a directory, a glob (``/data/incoming/*.csv``) or a list of those;
        local, or ``s3://bucket/...`` / ``gs://bucket/...``.
    :param output: datasets directory (local, ``s3://`` or ``gs://``); default ``<storage>/datasets``
        (see ``airflow_tf.storage``).
    :param name: dataset name (the directory under ``output``).
    :param version: version directory; default the next integer after the existing versions.
    {prepare_options}
    :param overwrite: replace the version if it exists (otherwise an existing version fails the task).
    :param cache: reuse the newest version made from the same input content and options
        instead of encoding again (logged; the input is read once more to fingerprint it).
    :param partition_key: the data partition this run prepares (e.g. ``"{{ ds }}"``): the
        version is named by it and the asset event carries it as its Airflow partition key
        (Airflow 3.2+; older: in the event's extra only). Join the last N partitions with
        :class:`DatasetWindowOperator`.
    :param progress_every: seconds between progress lines in the task log.
    :param aws_conn_id: Airflow connection with the credentials (and optionally the region and
        ``endpoint_url``) for ``s3://`` input or output; default: the environment's.
    :param gcp_conn_id: Airflow connection with a service-account key (``key_path`` or
        ``keyfile_dict``) for ``gs://``; default: the environment's (workload identity,
        ``GOOGLE_APPLICATION_CREDENTIALS``).
    :param target_shard_mb: deprecated since 0.2.0, removed in 0.3.0: ``target_shard_mib`` (it
        always meant MiB).
    :param workers: deprecated since 0.2.0, removed in 0.3.0: ``encode_threads``.
    """

    template_fields: Sequence[str] = (
        "input", "output_dir", "dataset_name", "version", "label_column", "eval_fraction", "seed",
        "split_key", "shards", "target_shard_mib", "compression", "schema", "allow_nan", "overwrite",
        "string_columns", "encode_threads", "buffer_mib", "cache", "partition_key", "vocabularies", "aws_conn_id",
        "gcp_conn_id",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {"schema": "json", "vocabularies": "json"}
    ui_color = "#c5e1a5"
    _lineage = prepare_lineage

    # The prepare options' defaults are PrepareOptions' (schema, string_columns: None stands for none).
    def __init__(self, *, input: Any, name: str, output: str | None = None, version: Any = None,
                 label: str | None = DEFAULTS.label, eval_fraction: Any = DEFAULTS.eval_fraction,
                 seed: Any = DEFAULTS.seed, split_key: str | None = DEFAULTS.split_key,
                 shards: Any = DEFAULTS.shards, target_shard_mib: Any = DEFAULTS.target_shard_mib,
                 compression: str | None = DEFAULTS.compression, schema: Any = None, string_columns: Any = None,
                 allow_nan: Any = DEFAULTS.allow_nan, overwrite: Any = False,
                 encode_threads: Any = DEFAULTS.encode_threads, progress_every: float = 5.0,
                 buffer_mib: Any = DEFAULTS.buffer_mib, cache: Any = False, partition_key: str | None = None,
                 vocabularies: Any = DEFAULTS.vocabularies, aws_conn_id: str | None = None,
                 gcp_conn_id: str | None = None, target_shard_mb: Any = None, workers: Any = None,
                 **kwargs: Any) -> None:
        if not is_template(check_name(name, "name")) and "outlets" not in kwargs:
            kwargs["outlets"] = [dataset_asset(name)]
        super().__init__(**kwargs)
        self.input = input
        # BaseOperator already has ``output`` (its XComArg) and ``label`` (display label).
        self.output_dir = output
        self.dataset_name = name
        self.version = version
        self.label_column = label
        self.eval_fraction = eval_fraction
        self.seed = seed
        self.split_key = split_key
        self.shards = shards
        self.target_shard_mib = renamed(type(self).__name__, "target_shard_mb", "target_shard_mib", target_shard_mb,
                                        target_shard_mib)
        self.compression = compression
        self.schema = schema
        self.string_columns = string_columns
        self.allow_nan = flag(allow_nan, "allow_nan")
        self.overwrite = flag(overwrite, "overwrite")
        self.encode_threads = renamed(type(self).__name__, "workers", "encode_threads", workers, encode_threads)
        self.progress_every = progress_every
        self.buffer_mib = buffer_mib
        self.cache = flag(cache, "cache")
        self.partition_key = partition_key
        self.vocabularies = vocabularies
        self.aws_conn_id, self.gcp_conn_id = aws_conn_id, gcp_conn_id

    def prepare_options(self) -> PrepareOptions:
        """The rendered arguments as the options of the prepare (each parsed and checked)."""
        return PrepareOptions(**{name: getattr(self, _ATTRIBUTES.get(name, name)) for name in PrepareOptions.names()})

    def _log_progress(self, progress: Any) -> None:
        self.log.info("%s", progress.describe())

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_tf.data import prepare_dataset

        output = self.output_dir or datasets_dir()
        with no_retry_for(ValueError, what="prepare refused"):  # a retry would read the same value again
            flags = {name: parse_bool(getattr(self, name), name) for name in ("overwrite", "cache")}
            options = self.prepare_options()
        self.log.info("Preparing dataset %r from %s into %s", self.dataset_name, self.input, output)
        summary = prepare_dataset(
            self.input, output, self.dataset_name, options=options,
            version=_optional(self.version, str),
            progress=self._log_progress,
            progress_every=self.progress_every,
            partition_key=_optional(self.partition_key, str),
            **flags,
            storage_options=storage_options(_optional(self.aws_conn_id, str), _optional(self.gcp_conn_id, str)),
        )
        if summary.get("cached"):
            self.log.info("Input unchanged (fingerprint %s): reusing dataset version %s, nothing encoded",
                          summary["fingerprint"], summary["dataset_uri"])
        else:
            self.log.info(
                "Dataset %s committed: %s examples (%s), %s files, %.1f s",
                summary["dataset_uri"], summary["rows"],
                ", ".join(f"{split} {count}" for split, count in summary["counts"].items()),
                sum(summary["shards"].values()), summary["seconds"],
            )
        asset = dataset_asset(self.dataset_name)
        if any(getattr(outlet, "name", None) == asset.name for outlet in self.outlets):
            # A reused version still emits the event (the task succeeded); "cached" tells consumers.
            event = context["outlet_events"][asset]
            event.extra = {
                "version": summary["version"], "path": summary["dataset_uri"], "rows": summary["rows"],
                "counts": summary["counts"], "cached": bool(summary.get("cached")),
            }
            if summary.get("partition") is not None:
                event.extra["partition"] = summary["partition"]
                emit_partition(event, summary["partition"])
        self._lineage_result = summary
        return summary


# The prepare options' documentation is PrepareOptions' (with their defaults), as the flags' help is.
PrepareTFRecordsOperator.__doc__ = (PrepareTFRecordsOperator.__doc__ or "").replace(
    "{prepare_options}", prepare_parameter_docs())


class DatasetWindowOperator(BaseOperator):
    """Commits a version of dataset ``name`` made of its last ``last`` partition versions
    (prepared with ``partition_key``), without copying a shard, and returns (XCom) the same
    summary as the prepare operator: pass ``.output`` as the training's ``dataset``. A
    reader of the window reads exactly those partitions' shards.

    :param name: dataset name.
    :param last: number of partitions, newest by partition key.
    :param output: datasets directory; default ``<storage>/datasets``.
    :param version: the window's version name; default ``window-<first key>--<last key>``.
    :param overwrite: replace a window version of that name (e.g. a re-run).
    """

    template_fields: Sequence[str] = ("dataset_name", "last", "output_dir", "version")
    ui_color = "#c5e1a5"

    def __init__(self, *, name: str, last: Any, output: str | None = None, version: str | None = None,
                 overwrite: Any = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dataset_name, self.last, self.output_dir = name, last, output
        self.version, self.overwrite = version, flag(overwrite, "overwrite")

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_tf.data.window import make_window

        summary = make_window(self.output_dir or datasets_dir(), self.dataset_name, last=int(self.last),
                              version=_optional(self.version, str), overwrite=parse_bool(self.overwrite, "overwrite"))
        self.log.info("Window %s: partitions %s, %s examples (%s)", summary["dataset_uri"],
                      ", ".join(summary["partitions"]), summary["rows"],
                      ", ".join(f"{split} {count}" for split, count in summary["counts"].items()))
        return summary


class PreparePartOperator(BaseOperator):
    """One part of a partitioned prepare (the ``part`` task of
    :func:`~airflow_tf.task_groups.tf_prepare`, mapped over the plan's parts): in this Airflow
    worker, or, with ``kubernetes``, as a Kubernetes Job on shared storage while this task
    waits, shows the part's log and returns its result.

    :param job: ``{"plan": directory, "index": N, "name": dataset, "token": plan id}`` (one
        item of the plan task's XCom).
    :param encode_threads: encoding threads of the part (default: the plan's, else the cores it may use).
    :param workers: deprecated since 0.2.0: ``encode_threads``.
    :param progress_every: seconds between progress lines.
    :param kubernetes: :class:`~airflow_tf.backends.kubernetes.KubernetesPartOptions`
        (or its dict): run the part as a pod; None runs it here.
    """

    ui_color = "#d9ead3"

    def __init__(self, *, job: Any, encode_threads: int | None = None, progress_every: float = 5.0,
                 kubernetes: dict[str, Any] | None = None, workers: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.encode_threads = renamed(type(self).__name__, "workers", "encode_threads", workers, encode_threads)
        self.progress_every = progress_every
        self.kubernetes = kubernetes

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_tf.backends.base import ComponentRefusedError
        from airflow_tf.data.errors import DataError

        index = int(self.job["index"])
        with no_retry_for(DataError, ComponentRefusedError, what=f"part {index} refused"):
            done = self._run_in_pod(index) if self.kubernetes else self._run_here(index)
        self.log.info("part %d written: %s rows (%s)", index, done["rows"], done["counts"])
        return done

    def _run_here(self, index: int) -> dict[str, Any]:
        from airflow_tf.data.parts import prepare_part

        return prepare_part(self.job["plan"], index, encode_threads=self.encode_threads,
                            progress=lambda p: self.log.info("part %d: %s", index, p.describe()),
                            progress_every=self.progress_every)

    def _run_in_pod(self, index: int) -> dict[str, Any]:
        from airflow_tf.backends.kubernetes.parts import KubernetesPartOptions, part_job_name, run_part

        options = KubernetesPartOptions.coerce(self.kubernetes or {})
        plan, dataset, token = self.job["plan"], self.job["name"], self.job["token"]
        self._part_job = (options, part_job_name(dataset, token, index))
        self.log.info("part %d runs as Kubernetes Job %s (image %s)", index, self._part_job[1], options.image)
        return run_part(options, plan=plan, index=index, dataset=dataset, token=token, encode_threads=self.encode_threads,
                        progress_every=self.progress_every, on_log=lambda line: self.log.info("| %s", line))

    def on_kill(self) -> None:
        """A killed part takes its pod with it: the part writes nothing more, so no version
        commits from it."""
        if getattr(self, "_part_job", None) is None:
            return
        from airflow_tf.backends.kubernetes.parts import delete_part

        options, name = self._part_job
        self.log.info("part killed: deleting its Job %s", name)
        backend = options.backend()
        delete_part(options, backend.namespace, name, backend)
