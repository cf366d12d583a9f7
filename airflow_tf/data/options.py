"""Prepare's options, declared once: :class:`PrepareOptions` holds every option that decides how
a prepare reads, splits, shards and encodes its input, with its default and its check. One
prepare, the part planner and its parts, the fingerprint, the staging into object storage, the
operator and the command line all take it whole. Also: the label it names applied to the schema."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping, Sequence

from ..cluster.training import is_unset, parse_bool
from ..deprecation import renamed
from .errors import DataError, SchemaError
from .schema import Schema

COMPRESSIONS = ("gzip", "zlib")
MAX_SHARDS = 10_000  # train files per split at most: each is a file every reader opens
# Parameters renamed in 0.2 (old -> new); the old names work until 0.3.0, with a warning.
RENAMED = {"target_shard_mb": "target_shard_mib", "workers": "encode_threads"}


def _number(value: Any, kind: type, name: str) -> Any:
    """``value`` (or the text a template rendered) as ``kind``; None stays None."""
    if is_unset(value):
        return None
    if isinstance(value, bool):
        raise DataError(f"{name} must be a number, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise DataError(f"{name} must be a {'whole ' if kind is int else ''}number, got {value!r}") from None


def _text(value: Any) -> str | None:
    return None if is_unset(value) else str(value)


def column_names(value: str | Sequence[str] | None) -> list[str]:
    """Column names from a list and/or comma-separated text (``"zip,id"``), as options give them."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    names = [part.strip() for item in items for part in str(item).split(",")]
    return list(dict.fromkeys(n for n in names if n))


@dataclass(frozen=True)
class PrepareOptions:
    """How a prepare turns its input into a dataset version. Values may be rendered template
    text (``"0.3"``, ``"None"``, ``"true"``): each is parsed to its type and checked when the
    options are made, and a bad one raises :class:`DataError` naming the option."""

    label: str | None = None
    """The label column."""
    eval_fraction: float = 0.2
    """Share of rows held out for evaluation, in [0, 1)."""
    seed: int = 0
    """Seed of the split: the same input and seed give the same split."""
    split_key: str | None = None
    """Split by a hash of this column, so that equal keys share a split."""
    shards: int | None = None
    """Number of train files (eval gets a proportional number)."""
    target_shard_mib: float | None = None
    """Instead of ``shards``: the size of each train file in MiB (default 128)."""
    compression: str | None = None
    """``"gzip"``, ``"zlib"`` or None."""
    schema: Schema | None = None
    """The declared schema (a Schema, its dict, JSON text or a path to schema.json); None infers it."""
    string_columns: tuple[str, ...] = ()
    """CSV columns to read as text (names, or one text of names separated by commas)."""
    allow_nan: bool = False
    """Accept NaN and infinity in float columns."""
    vocabularies: Mapping[str, int] | tuple[str, ...] | str | None = None
    """Columns whose top values to keep with the version (see :mod:`airflow_tf.data.vocabulary`)."""
    encode_threads: int | None = None
    """Threads that encode in parallel; None: the cores this process may use."""
    buffer_mib: float = 512.0
    """Memory for rows being read and encoded, in MiB."""

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        for option in dataclasses.fields(self):  # unset (a template's '' or 'None'): the default
            if option.default is not None and is_unset(getattr(self, option.name)):
                put(option.name, option.default)

        put("label", _text(self.label))
        put("split_key", _text(self.split_key))
        put("eval_fraction", _number(self.eval_fraction, float, "eval_fraction"))
        put("seed", _number(self.seed, int, "seed"))
        put("shards", _number(self.shards, int, "shards"))
        put("target_shard_mib", _number(self.target_shard_mib, float, "target_shard_mib"))
        put("encode_threads", _number(self.encode_threads, int, "encode_threads"))
        put("buffer_mib", _number(self.buffer_mib, float, "buffer_mib"))
        put("compression", _compression(self.compression))
        put("schema", None if is_unset(self.schema) or self.schema == {} else Schema.coerce(self.schema))  # type: ignore[arg-type]
        put("string_columns", tuple(column_names(None if is_unset(self.string_columns) else self.string_columns)))
        try:
            put("allow_nan", parse_bool(self.allow_nan, "allow_nan"))
        except ValueError as exc:
            raise DataError(str(exc)) from None
        vocabularies = self.vocabularies
        put("vocabularies", None if is_unset(vocabularies) or vocabularies == {} else
            tuple(vocabularies) if isinstance(vocabularies, list) else vocabularies)
        self._check()

    def _check(self) -> None:
        if not 0 <= self.eval_fraction < 1:
            raise DataError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.shards is not None and not 1 <= self.shards <= MAX_SHARDS:
            raise DataError(f"shards must be between 1 and {MAX_SHARDS:,}, got {self.shards}")
        if self.shards is not None and self.target_shard_mib is not None:
            raise DataError("give either shards or target_shard_mib, not both")
        if self.target_shard_mib is not None and not self.target_shard_mib > 0:
            raise DataError(f"target_shard_mib must be positive (MiB per train file), got {self.target_shard_mib}")
        if self.encode_threads is not None and self.encode_threads < 1:
            raise DataError(f"encode_threads must be at least 1, got {self.encode_threads}")
        if not self.buffer_mib >= 1:
            raise DataError(f"buffer_mib must be at least 1 (MiB of buffered rows), got {self.buffer_mib}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def given(cls, options: PrepareOptions | None, where: str, values: Mapping[str, Any]) -> PrepareOptions:
        """The options of a call that takes ``options=`` or each option by name (``values``,
        which may hold the deprecated names): not both, and no name that is not an option."""
        values = dict(values)
        for old, new in RENAMED.items():
            if old in values:
                values[new] = renamed(where, old, new, values.pop(old), values.get(new),
                                      unset=getattr(DEFAULTS, new))
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise DataError(f"{where}: unknown option(s) {', '.join(unknown)}; the options are {', '.join(cls.names())}")
        if options is None:
            return cls(**values)
        if not isinstance(options, PrepareOptions):
            raise DataError(f"{where}: options must be a PrepareOptions, got {type(options).__name__}")
        if cls(**values) != DEFAULTS:
            raise DataError(f"{where}: give options=PrepareOptions(...) or the options one by one, not both")
        return options

    @property
    def threads(self) -> int:
        """Encoding threads: ``encode_threads``, else the cores this process may use."""
        from .cpus import usable_cpus

        return self.encode_threads or usable_cpus()

    def fingerprint(self) -> dict[str, Any]:
        """The options that shape a version's content, as the input cache records them (the
        thread count and the buffer change how fast it is made, not what)."""
        return {
            "label": self.label, "eval_fraction": self.eval_fraction, "shards": self.shards,
            # Its key before the rename: versions cached by 0.1 keep matching.
            "target_shard_mb": self.target_shard_mib, "compression": self.compression,
            "schema": self.schema.to_dict() if self.schema else None, "string_columns": sorted(self.string_columns),
            "seed": self.seed, "split_key": self.split_key, "allow_nan": self.allow_nan,
            "vocabularies": self.vocabularies,
        }

    def to_dict(self) -> dict[str, Any]:
        """As JSON (a part plan records the options its parts use)."""
        values = dataclasses.asdict(self)
        values["schema"] = self.schema.to_dict() if self.schema else None
        values["string_columns"] = list(self.string_columns)
        if isinstance(self.vocabularies, tuple):
            values["vocabularies"] = list(self.vocabularies)
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PrepareOptions:
        """From :meth:`to_dict`, or from a plan written before the rename (``target_shard_mb``)."""
        values = dict(values)
        if "target_shard_mb" in values:
            values.setdefault("target_shard_mib", values.pop("target_shard_mb"))
        return cls(**{k: v for k, v in values.items() if k in cls.names()})


def _compression(value: Any) -> str | None:
    if is_unset(value) or str(value).strip().lower() == "none":
        return None
    if str(value).lower() not in COMPRESSIONS:
        raise DataError(f"compression {value!r} is not supported; use 'gzip', 'zlib' or none")
    return str(value).lower()


DEFAULTS = PrepareOptions()


def with_label(schema: Schema, label: str | None) -> Schema:
    if label is None:
        return schema
    if label not in schema:
        raise SchemaError(f"label column {label!r} is not in the input (columns: {', '.join(schema.names)})")
    if schema.label_name not in (None, label):
        raise SchemaError(
            f"label {label!r} differs from the declared schema's label {schema.label_name!r}; give one of them"
        )
    return schema.with_label(label)
