"""The dataset schema (``schema.json``) and the ``_SUCCESS`` manifest of a dataset version.

Pure Python: Airflow-side code calls :func:`load_schema` and :func:`count_examples` cheaply,
without importing TensorFlow."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_tf.files import local_path

from . import object_store
from .errors import DatasetNotReadyError, SchemaError

FORMAT_VERSION = 1
DTYPES = ("int64", "float32", "string")
SCHEMA_FILE = "schema.json"
SUCCESS_FILE = "_SUCCESS"


@dataclass(frozen=True)
class FeatureSpec:
    """One column of the dataset: a fixed-length feature of ``prod(shape)`` values."""

    name: str
    dtype: str
    shape: tuple[int, ...] = ()
    allow_nan: bool = False
    """float32 only: NaN and +-inf are accepted instead of rejected."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        where = f"feature {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError(f"feature name must be a non-empty string, got {self.name!r}")
        if self.dtype not in DTYPES:
            raise SchemaError(f"{where}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if any(d < 1 for d in self.shape):
            raise SchemaError(f"{where}: shape {list(self.shape)} must have positive dimensions")
        if self.allow_nan and self.dtype != "float32":
            raise SchemaError(f"{where}: allow_nan applies to float32 features only, not {self.dtype}")

    @property
    def size(self) -> int:
        """Number of values per example."""
        return math.prod(self.shape)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.dtype == "float32":
            data["allow_nan"] = self.allow_nan
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "schema") -> FeatureSpec:
        if not isinstance(data, dict):
            raise SchemaError(f"{where}: each feature must be an object with name, dtype, shape; got {data!r}")
        unknown = set(data) - {"name", "dtype", "shape", "allow_nan"}
        if unknown:
            raise SchemaError(f"{where}: feature {data.get('name')!r} has unknown keys {sorted(unknown)}")
        if "name" not in data or "dtype" not in data:
            raise SchemaError(f"{where}: feature {data!r} needs at least 'name' and 'dtype'")
        shape = data.get("shape", [])
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) for d in shape):
            raise SchemaError(f"{where}: feature {data['name']!r}: shape must be a list of integers, got {shape!r}")
        try:
            return cls(data["name"], data["dtype"], tuple(shape), bool(data.get("allow_nan", False)))
        except SchemaError as exc:
            raise SchemaError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class Schema:
    """Features in column order; ``label_name`` names the label feature (or None)."""

    features: tuple[FeatureSpec, ...]
    label_name: str | None = None
    format_version: int = FORMAT_VERSION
    vocabularies: dict[str, dict[str, Any]] | None = None
    """Per column, the vocabulary prepare counted (``file`` relative to the dataset version,
    ``size``, ``top_k``, ``distinct``); see :mod:`airflow_tf.data.vocabulary`."""
    root: Path | str | None = field(default=None, repr=False, compare=False)
    """The dataset version directory (or ``s3://``/``gs://`` URI) the schema was loaded from
    (where vocabulary files are)."""
    _by_name: dict[str, FeatureSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(self.features))
        if not self.features:
            raise SchemaError("a schema needs at least one feature")
        by_name: dict[str, FeatureSpec] = {}
        for spec in self.features:
            if spec.name in by_name:
                raise SchemaError(f"feature {spec.name!r} appears twice in the schema")
            by_name[spec.name] = spec
        object.__setattr__(self, "_by_name", by_name)
        if self.label_name is not None and self.label_name not in by_name:
            raise SchemaError(
                f"label {self.label_name!r} is not a feature of the schema "
                f"(features: {', '.join(by_name)})"
            )
        if self.format_version != FORMAT_VERSION:
            raise SchemaError(
                f"schema format_version {self.format_version} is not supported "
                f"(this airflow-tf reads version {FORMAT_VERSION}); upgrade airflow-tf or re-prepare the dataset"
            )

    @property
    def label(self) -> FeatureSpec | None:
        return self._by_name[self.label_name] if self.label_name else None

    @property
    def feature_names(self) -> list[str]:
        """Input feature names, label excluded, in column order."""
        return [f.name for f in self.features if f.name != self.label_name]

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.features]

    def __getitem__(self, name: str) -> FeatureSpec:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def with_label(self, label: str | None) -> Schema:
        return Schema(self.features, label, self.format_version, self.vocabularies, self.root)

    def vocabulary(self, name: str) -> list[str]:
        """The values of column ``name`` that prepare kept (the most frequent first), e.g. for
        ``keras.layers.StringLookup(vocabulary=schema.vocabulary("user"))``."""
        location = self.vocabulary_file(name)
        if object_store.is_remote(location):
            return object_store.read_text(location).splitlines()
        with open(location, encoding="utf-8") as handle:
            return handle.read().splitlines()

    def vocabulary_file(self, name: str) -> str:
        """The path of column ``name``'s vocabulary file (one value per line)."""
        info = (self.vocabularies or {}).get(name)
        if info is None:
            have = ", ".join(sorted(self.vocabularies or {})) or "none"
            raise SchemaError(f"column {name!r} has no vocabulary in this dataset (vocabularies: {have}); prepare it "
                              f"with vocabularies={{{name!r}: K}} to keep its K most frequent values")
        if self.root is None:
            raise SchemaError(f"the vocabulary of {name!r} is a file of the dataset version; load the schema with "
                              "airflow_tf.data.load_schema(dataset_uri)")
        if isinstance(self.root, str):
            return object_store.join(self.root, info["file"])
        return str(self.root / info["file"])

    def to_dict(self) -> dict[str, Any]:
        data = {
            "format_version": self.format_version,
            "features": [f.to_dict() for f in self.features],
            "label": self.label_name,
        }
        if self.vocabularies:
            data["vocabularies"] = self.vocabularies
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "schema") -> Schema:
        if not isinstance(data, dict) or not isinstance(data.get("features"), list):
            raise SchemaError(f"{where}: expected an object with a 'features' list")
        unknown = set(data) - {"format_version", "features", "label", "vocabularies"}
        if unknown:
            raise SchemaError(f"{where}: unknown keys {sorted(unknown)} "
                              "(allowed: format_version, features, label, vocabularies)")
        features = [FeatureSpec.from_dict(f, where) for f in data["features"]]
        vocabularies = data.get("vocabularies")
        if vocabularies is not None and not (isinstance(vocabularies, dict) and all(
                isinstance(v, dict) and isinstance(v.get("file"), str) for v in vocabularies.values())):
            raise SchemaError(f"{where}: 'vocabularies' must map columns to {{\"file\": ...}} records")
        try:
            return cls(tuple(features), data.get("label"), int(data.get("format_version", FORMAT_VERSION)),
                       vocabularies)
        except SchemaError as exc:
            raise SchemaError(f"{where}: {exc}") from None

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Schema:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise SchemaError(f"cannot read schema file {path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"schema file {path} is not valid JSON: {exc}") from None
        return cls.from_dict(data, where=f"schema file {path}")

    @classmethod
    def coerce(cls, value: Schema | dict | str | os.PathLike) -> Schema:
        """A Schema from a Schema, its dict, a JSON string or a path to a JSON file."""
        if isinstance(value, Schema):
            return value
        if isinstance(value, dict):
            return cls.from_dict(value)
        if isinstance(value, str) and value.lstrip().startswith("{"):
            try:
                return cls.from_dict(json.loads(value))
            except json.JSONDecodeError as exc:
                raise SchemaError(f"schema JSON is not valid: {exc}") from None
        return cls.from_file(value)


def dataset_path(dataset_uri: str | os.PathLike) -> Path:
    """The local directory of a dataset version (``file://`` accepted)."""
    try:
        return local_path(dataset_uri, "dataset URI")
    except ValueError as exc:
        raise DatasetNotReadyError(str(exc)) from None


def dataset_location(dataset_uri: str | os.PathLike) -> Path | str:
    """A dataset version's local directory, or its ``s3://``/``gs://`` URI (read through
    ``pyarrow.fs`` with the environment's credentials); another scheme is refused."""
    text = os.fspath(dataset_uri)
    if not object_store.is_remote(text):
        return dataset_path(text)
    try:
        object_store.check_location(text, "dataset URI")
    except ValueError as exc:
        raise DatasetNotReadyError(str(exc)) from None
    return text.rstrip("/")


def _file_of(root: Path | str, *parts: str) -> Path | str:
    return object_store.join(root, *parts) if isinstance(root, str) else root.joinpath(*parts)


def _read(location: Path | str) -> str:
    if isinstance(location, str):
        return object_store.read_text(location)
    return location.read_text(encoding="utf-8")


def read_manifest(dataset_uri: str | os.PathLike) -> dict[str, Any]:
    """The ``_SUCCESS`` manifest: counts per split and per shard. Refuses an unfinished dataset."""
    root = dataset_location(dataset_uri)
    marker = _file_of(root, SUCCESS_FILE)
    if isinstance(root, Path) and not root.is_dir():
        raise DatasetNotReadyError(f"dataset directory {root} does not exist; run the prepare step first")
    try:
        text = _read(marker)
    except FileNotFoundError:
        raise DatasetNotReadyError(
            f"dataset {root} has no {SUCCESS_FILE} marker: it was not completely written "
            "(still being prepared, or the prepare step failed); re-run the prepare step"
        ) from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetNotReadyError(f"{marker} is not valid JSON ({exc}); re-run the prepare step") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
        raise DatasetNotReadyError(f"{marker} has no 'splits'; re-run the prepare step")
    return manifest


def load_schema(dataset_uri: str | os.PathLike) -> Schema:
    """The schema of a committed dataset version (refuses one without ``_SUCCESS``)."""
    read_manifest(dataset_uri)
    root = dataset_location(dataset_uri)
    if isinstance(root, str):
        location = object_store.join(root, SCHEMA_FILE)
        try:
            data = json.loads(object_store.read_text(location))
        except (FileNotFoundError, json.JSONDecodeError) as exc:
            raise SchemaError(f"cannot read schema file {location}: {exc}") from None
        schema = Schema.from_dict(data, where=f"schema file {location}")
    else:
        schema = Schema.from_file(root / SCHEMA_FILE)
    object.__setattr__(schema, "root", root)
    return schema


def split_info(dataset_uri: str | os.PathLike, split: str) -> dict[str, Any]:
    """The manifest entry of one split: ``examples`` and ``shards`` (file, examples, bytes)."""
    splits = read_manifest(dataset_uri)["splits"]
    if split not in splits:
        available = ", ".join(sorted(splits)) or "none"
        raise DatasetNotReadyError(
            f"dataset {dataset_location(dataset_uri)} has no {split!r} split (available: {available})"
        )
    return splits[split]


def count_examples(dataset_uri: str | os.PathLike, split: str = "train") -> int:
    """Number of examples in a split, from ``_SUCCESS`` (no file is scanned)."""
    return int(split_info(dataset_uri, split)["examples"])


def split_files(dataset_uri: str | os.PathLike, split: str) -> list[str]:
    """The shard files of a split, in shard order. A window version's shards live in the
    partition versions beside it: such a shard names its ``version``."""
    root = dataset_location(dataset_uri)
    files = []
    for shard in split_info(dataset_uri, split)["shards"]:
        holder = shard.get("version")
        if holder is None:
            files.append(str(_file_of(root, split, shard["file"])))
            continue
        if not isinstance(holder, str) or holder in ("", ".", "..") or "/" in holder or "\\" in holder:
            raise DatasetNotReadyError(f"{_file_of(root, SUCCESS_FILE)}: shard version {holder!r} is not a version name")
        parent = root.rsplit("/", 1)[0] if isinstance(root, str) else root.parent
        files.append(str(_file_of(parent, holder, split, shard["file"])))
    return files


def compression_of(dataset_uri: str | os.PathLike) -> str | None:
    return read_manifest(dataset_uri).get("compression")


