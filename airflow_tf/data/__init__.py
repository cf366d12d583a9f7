"""TFRecord preparation and reading: schema, conversion, atomic commit, tf.data input.

Reading the schema and counts (:func:`load_schema`, :func:`count_examples`) imports neither
TensorFlow nor the converters; :func:`make_dataset` and :func:`parse_spec` import TensorFlow
when called, and :func:`prepare_dataset` loads the converters on first use."""

from __future__ import annotations

from typing import Any

from .errors import (
    DataError, DatasetExistsError, DatasetNotReadyError, InputDataError, SchemaError,
)
from .options import PrepareOptions
from .reader import make_dataset, parse_spec
from .schema import (
    FeatureSpec, Schema, count_examples, dataset_path, load_schema, read_manifest, split_files,
)

__all__ = [
    "DataError", "DatasetExistsError", "DatasetNotReadyError", "FeatureSpec", "InputDataError",
    "PrepareOptions", "Progress", "Schema", "SchemaError", "count_examples", "dataset_path", "load_schema",
    "make_dataset", "parse_spec", "prepare_dataset", "read_manifest", "split_files",
]


def __getattr__(name: str) -> Any:
    # The converters need pyarrow; load them only when preparing data.
    if name in ("prepare_dataset", "Progress"):
        from . import prepare

        return getattr(prepare, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
