"""OpenLineage for the pipeline's operators: what each task read and wrote, as the
``apache-airflow-providers-openlineage`` provider asks operators for it
(``get_openlineage_facets_on_start`` / ``_on_complete``, from :class:`LineageMethods`).

A run becomes one graph from raw data to a model version:

- prepare: the raw files or object-store URIs -> the dataset version (schema, row counts, splits);
- launch: the dataset version -> the run directory (a run facet with the training options and the
  group's shape);
- evaluate: the run directory and the dataset version, the metrics and threshold checks as facets;
- export: the run directory -> the model version (``<serving_base>/<model>/<version>``), blessed or not.

A local path is named ``file://<this host>`` + its absolute path, an object-store URI by its
bucket (``s3://bucket``, ``gs://bucket``) + its key: the names a user searches a lineage store for.

The provider (and the OpenLineage client it brings) is imported only when Airflow asks for lineage:
without it the operators work as before and these methods are never called."""

from __future__ import annotations

import functools
import logging
import os
import socket
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from airflow_tf.files import strip_file_scheme

log = logging.getLogger(__name__)

# The keys of this package's own facets (run, dataset and input facets beside OpenLineage's standard ones).
TRAINING_FACET = "airflow_tf_training"
DATASET_FACET = "airflow_tf_dataset"
EVALUATION_FACET = "airflow_tf_evaluation"
MODEL_FACET = "airflow_tf_model"


def naming(uri: str | os.PathLike[str]) -> tuple[str, str]:
    """The OpenLineage namespace and name of a file or directory: ``("file://<host>", "/abs/path")``
    for a local path or ``file://`` URI, ``("s3://bucket", "key/of/it")`` for an object-store URI."""
    text = os.fspath(uri)
    if not text:
        raise ValueError("lineage: a dataset location is empty; expected a path or a URI")
    if text.startswith("file://") or "://" not in text:
        return f"file://{socket.gethostname()}", os.path.normpath(os.path.abspath(strip_file_scheme(text)))
    parts = urlsplit(text)
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"lineage: {text!r} is not a path nor a URI with a bucket (scheme://bucket/key)")
    return f"{parts.scheme.lower()}://{parts.netloc}", parts.path.strip("/") or "/"


@functools.cache
def _api() -> Any:
    """The provider's and client's classes, and this package's facets; None without the provider."""
    try:
        import attr
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import InputDataset, OutputDataset
        from openlineage.client.facet_v2 import (DatasetFacet, RunFacet, data_quality_assertions_dataset,
                                                 dataset_version_dataset, output_statistics_output_dataset,
                                                 schema_dataset)
    except ImportError:
        return None

    @attr.define
    class TrainingRunFacet(RunFacet):
        """The training options, the group's shape (ps, workers, chief) and where it runs."""

        options: dict[str, Any] = attr.field(factory=dict)
        shape: dict[str, int] = attr.field(factory=dict)
        group: dict[str, Any] = attr.field(factory=dict)

    @attr.define
    class DatasetVersionFacet(DatasetFacet):
        """A prepared dataset version: its name, version, examples and files per split."""

        name: str
        version: str
        counts: dict[str, int] = attr.field(factory=dict)
        shards: dict[str, int] = attr.field(factory=dict)
        label: str | None = None
        compression: str | None = None
        cached: bool = False

    @attr.define
    class EvaluationFacet(DatasetFacet):
        """An evaluation of a run's final checkpoint: the metrics and whether it is blessed."""

        metrics: dict[str, float]
        blessed: bool
        reasons: list[str] = attr.field(factory=list)
        examples: int = 0
        split: str = "eval"
        global_step: int | None = None
        checkpoint: str | None = None

    @attr.define
    class ModelVersionFacet(DatasetFacet):
        """A published model version: the served name, its version and the evaluation behind it."""

        model_name: str
        version: int
        blessed: bool
        forced: bool = False
        metrics: dict[str, Any] = attr.field(factory=dict)
        global_step: int | None = None

    return SimpleNamespace(
        OperatorLineage=OperatorLineage, InputDataset=InputDataset, OutputDataset=OutputDataset,
        Schema=schema_dataset.SchemaDatasetFacet, Field=schema_dataset.SchemaDatasetFacetFields,
        Version=dataset_version_dataset.DatasetVersionDatasetFacet,
        OutputStatistics=output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet,
        Assertions=data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet,
        Assertion=data_quality_assertions_dataset.Assertion,
        TrainingRunFacet=TrainingRunFacet, DatasetVersionFacet=DatasetVersionFacet, EvaluationFacet=EvaluationFacet,
        ModelVersionFacet=ModelVersionFacet,
    )


def _dataset(kind: Any, uri: str, facets: dict[str, Any] | None = None, **extra: Any) -> Any:
    namespace, name = naming(uri)
    return kind(namespace=namespace, name=name, facets=facets or {}, **extra)


def _given_locations(value: Any) -> list[str]:
    """The locations an operator argument names (a path or URI, or a list of them); [] for
    anything else (an unrendered template, an XCom dict)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [os.fspath(v) for v in values if isinstance(v, (str, os.PathLike)) and os.fspath(v)]


def prepare_lineage(operator: Any, summary: dict[str, Any] | None) -> Any:
    """The raw inputs -> the dataset version a prepare committed (``summary``: its XCom; None
    before it ran: the inputs as given)."""
    api = _api()
    sources = (summary or {}).get("sources") or _given_locations(operator.input)
    inputs = [_dataset(api.InputDataset, source) for source in sources]
    if summary is None:
        return api.OperatorLineage(inputs=inputs)
    schema = summary.get("schema") or {}
    fields = [api.Field(name=str(feature["name"]), type=str(feature.get("dtype")),
                        description=f"shape {feature.get('shape', [])}")
              for feature in schema.get("features", [])]
    facets = {
        "schema": api.Schema(fields=fields),
        "version": api.Version(datasetVersion=str(summary["version"])),
        DATASET_FACET: api.DatasetVersionFacet(
            name=str(summary["name"]), version=str(summary["version"]), counts=dict(summary.get("counts") or {}),
            shards=dict(summary.get("shards") or {}), label=schema.get("label"),
            compression=summary.get("compression"), cached=bool(summary.get("cached"))),
    }
    statistics = api.OutputStatistics(rowCount=int(summary["rows"]),
                                      fileCount=sum((summary.get("shards") or {}).values()))
    output = _dataset(api.OutputDataset, summary["dataset_uri"], facets,
                      outputFacets={"outputStatistics": statistics})
    return api.OperatorLineage(inputs=inputs, outputs=[output])


def training_lineage(operator: Any, result: dict[str, Any] | None) -> Any:
    """The dataset version -> the run directory, with the training options and the group's shape
    (``result``: the launch's XCom; None before it ran: the options as set on the task)."""
    from airflow_tf.cluster.training import dataset_uri_of

    api = _api()
    shape = {}
    for role in ("ps", "workers", "chief"):
        try:
            shape[role] = int(getattr(operator, role))
        except (TypeError, ValueError):
            continue  # not rendered yet: the complete event has it
    if result is None:
        facet = api.TrainingRunFacet(options=operator.training_options(), shape=shape)
        try:
            inputs = [_dataset(api.InputDataset, dataset_uri_of(operator.dataset))]
        except ValueError:
            inputs = []  # not a dataset (yet): the launch itself names what is wrong with it
        return api.OperatorLineage(inputs=inputs, run_facets={TRAINING_FACET: facet})
    training = dict(result["training"])
    run_dir, dataset = training.pop("run_dir"), training.pop("dataset")
    training.pop("code_dir", None)  # a path inside the run directory, not an option a user set
    group = {key: result["group"].get(key) for key in ("backend", "name", "namespace", "uid")}
    facet = api.TrainingRunFacet(options=training, shape=shape, group=group)
    return api.OperatorLineage(inputs=[_dataset(api.InputDataset, dataset)],
                               outputs=[_dataset(api.OutputDataset, run_dir)], run_facets={TRAINING_FACET: facet})


def _launch_datasets(launch: Any) -> tuple[str, str] | None:
    """The run directory and dataset of a launch's XCom; None when it is not one (yet)."""
    if isinstance(launch, dict) and isinstance(launch.get("run_dir"), str) and isinstance(launch.get("dataset"), str):
        return launch["run_dir"], launch["dataset"]
    return None


def evaluation_lineage(operator: Any, result: dict[str, Any] | None) -> Any:
    """The run directory and the dataset version it is evaluated on; after the evaluation, its
    metrics, blessing and threshold checks as facets of the run directory."""
    api = _api()
    launched = _launch_datasets(operator.launch)
    if launched is None:
        return api.OperatorLineage()
    run_dir, dataset = launched
    facets = {}
    if result is not None:
        facets[EVALUATION_FACET] = api.EvaluationFacet(
            metrics={k: float(v) for k, v in result["metrics"].items()}, blessed=bool(result["blessed"]),
            reasons=list(result.get("reasons") or []), examples=int(result.get("examples") or 0),
            split=str(result.get("split") or "eval"), global_step=result.get("global_step"),
            checkpoint=result.get("checkpoint"))
        facets["dataQualityAssertions"] = api.Assertions(assertions=[
            api.Assertion(assertion=_check_text(check), success=bool(check.get("passed")), column=check.get("metric"))
            for check in result.get("checks") or []])
    return api.OperatorLineage(inputs=[_dataset(api.InputDataset, run_dir, facets),
                                       _dataset(api.InputDataset, dataset)])


def _check_text(check: dict[str, Any]) -> str:
    """A blessing check as one line: ``mse max 1.0``, ``accuracy baseline 0.93``, ``none``."""
    return " ".join(str(check[key]) for key in ("metric", "rule", "limit") if check.get(key) is not None)


def export_lineage(operator: Any, result: dict[str, Any] | None) -> Any:
    """The run directory -> the model version it published (blessed or forced, its metrics)."""
    api = _api()
    launched = _launch_datasets(operator.launch)
    inputs = [] if launched is None else [_dataset(api.InputDataset, launched[0])]
    if result is None:
        return api.OperatorLineage(inputs=inputs)
    metrics = result.get("metrics") or {}
    facets = {
        "version": api.Version(datasetVersion=str(result["version"])),
        MODEL_FACET: api.ModelVersionFacet(
            model_name=str(result["model_name"]), version=int(result["version"]),
            blessed=bool(result.get("blessed", metrics.get("blessed", False))), forced=bool(result.get("forced")),
            metrics=dict(metrics.get("metrics", metrics)), global_step=result.get("global_step")),
    }
    return api.OperatorLineage(inputs=inputs, outputs=[_dataset(api.OutputDataset, result["path"], facets)])


class LineageMethods:
    """The provider's lineage methods for an operator whose ``_lineage`` builds its lineage
    from the operator and the result its ``execute`` kept in ``_lineage_result`` (None until then).
    A failure to build lineage is logged, never the task's failure."""

    _lineage: Any = None  # one of the *_lineage functions above
    _lineage_result: dict[str, Any] | None = None

    def _openlineage(self, result: dict[str, Any] | None) -> Any:
        if _api() is None:
            return None
        try:
            return type(self)._lineage(self, result)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("OpenLineage: no lineage for task %s: %s", getattr(self, "task_id", "?"), exc)
            return None

    def get_openlineage_facets_on_start(self) -> Any:
        return self._openlineage(None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self._openlineage(self._lineage_result)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return self._openlineage(None)  # what the task was to read; it wrote nothing to name
