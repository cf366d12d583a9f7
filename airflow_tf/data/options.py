"""Prepare's options, declared once: :class:`PrepareOptions` holds every option that decides how
a prepare reads, splits, shards and encodes its input, with its default and its check. One
prepare, the part planner and its parts, the fingerprint, the staging into object storage, the
operator and the command line all take it whole. Also: the label it names applied to the schema."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Mapping, Sequence

from ..cluster.declarations import Bounds, flag_name, flag_settings
from ..cluster.declarations import option as declared_option
from ..cluster.declarations import parameter_docs
from ..cluster.training import is_unset, parse_bool
from ..deprecation import renamed
from .errors import DataError, SchemaError
from .schema import Schema

COMPRESSIONS = ("gzip", "zlib")
MAX_SHARDS = 10_000  # train files per split at most: each is a file every reader opens
DEFAULT_TARGET_SHARD_MIB = 128.0
"""The size of a train file when neither ``shards`` nor ``target_shard_mib`` is given."""
EXCLUSIVE = ("shards", "target_shard_mib")
"""Two ways to size the train files: one of them at most."""
# Parameters renamed in 0.2 (old -> new); the old names work until 0.3.0, with a warning.
RENAMED = {"target_shard_mb": "target_shard_mib", "workers": "encode_threads"}


def _option(default: Any, doc: str, **declared: Any) -> Any:
    """A prepare option, declared once (see :func:`airflow_tf.cluster.declarations.option`): the
    checks, the flags of ``airflow-tf prepare`` (:func:`add_prepare_arguments`) and the parameter
    documentation of the operator and of :class:`PrepareOptions` (:func:`prepare_parameter_docs`) read it."""
    return declared_option(default, doc, **declared)


def prepare_parameter_docs(names: Mapping[str, str] | None = None, indent: str = "    ") -> str:
    """A ``:param name: ...`` line per prepare option (``names``: a parameter named otherwise)."""
    return parameter_docs(dataclasses.fields(PrepareOptions), names, indent)


def add_prepare_arguments(parser: Any, **types: Callable[[str], Any]) -> None:
    """Every prepare option as a flag of ``airflow-tf prepare``, made from its declaration:
    ``--eval-fraction`` for ``eval_fraction``, its type, default, choices and help; the two
    ways to size the train files exclusive; each deprecated name a hidden flag. ``types``: an
    option's own argparse ``type`` (``vocabularies``: JSON or names)."""
    import argparse

    exclusive = parser.add_mutually_exclusive_group()
    old_names = {new: old for old, new in RENAMED.items()}
    for field in dataclasses.fields(PrepareOptions):
        settings = flag_settings(field)
        if field.name in types:
            settings["type"] = types[field.name]
        group = exclusive if field.name in EXCLUSIVE else parser
        group.add_argument(flag_name(field), **settings)
        if field.name in old_names:  # deprecated: the flag still works, unlisted
            group.add_argument("--" + old_names[field.name].replace("_", "-"), type=settings.get("type"),
                               help=argparse.SUPPRESS)


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

    label: str | None = _option(None, "the label column")
    eval_fraction: float = _option(0.2, "share of rows held out for evaluation", bounds=Bounds(0, 1, high_open=True))
    seed: int = _option(0, "seed of the train/eval split and the row shuffle",
                        python="the same input and seed give the same split")
    split_key: str | None = _option(None, "split by a hash of this column: equal keys share a split",
                                    cli={"metavar": "COL"})
    shards: int | None = _option(None, "number of train files (eval gets a proportional number; at least 100 rows "
                                 "per file and 10,000 files at most)", bounds=Bounds(1, MAX_SHARDS))
    target_shard_mib: float | None = _option(None, "target size of each file in MiB", python="instead of ``shards``",
                                             bounds=Bounds(0, low_open=True, why="MiB per train file"),
                                             unset=DEFAULT_TARGET_SHARD_MIB)
    compression: str | None = _option(None, "compress the files", python="``gzip``, ``zlib`` or None (TFRecord's "
                                      "GZIP and ZLIB)", unset="none", cli={"choices": [*COMPRESSIONS, "none"]})
    schema: Schema | None = _option(  # noqa: RUF009  a field(): ruff does not see through _option
        None, "declared schema.json (features with name, dtype, shape; optional label)",
        python="a path to schema.json, its dict or JSON text, or a ``Schema``; None infers it from the input")
    string_columns: tuple[str, ...] = _option((), "CSV columns to read as text (an inferred column must otherwise "
                                              "be all numbers or all text)",
                                              python="a list, or names separated by commas",
                                              cli={"note": "may be repeated", "action": "append",
                                                   "metavar": "COL[,COL...]"})
    allow_nan: bool = _option(False, "accept NaN and infinity in float columns")
    vocabularies: Mapping[str, int] | tuple[str, ...] | str | None = _option(
        None, "string or integer columns whose most frequent training values to keep with the dataset "
        "(vocabularies/<col>.txt, read by a model as schema.vocabulary(\"<col>\")): column names for the top "
        "100,000 each, or a JSON object of sizes, e.g. '{\"user\": 50000}'",
        python="a dict of sizes (``{\"user\": 100000}``) or column names (see :mod:`airflow_tf.data.vocabulary`)",
        cli={"metavar": "COL[,COL...]|JSON|@FILE"})
    encode_threads: int | None = _option(None, "encoding threads", bounds=Bounds(1),
                                         unset="the cores this process may use, within its CPU limit")
    buffer_mib: float = _option(512.0, "memory for rows being read and encoded, in MiB",
                                bounds=Bounds(1, why="MiB of buffered rows"), note="the input may be larger")

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
        for option in dataclasses.fields(self):
            bounds, value = option.metadata["bounds"], getattr(self, option.name)
            if bounds is not None and value is not None and not bounds.holds(value):
                raise DataError(f"{option.name} must be {bounds}, got {value}")
        if all(getattr(self, name) is not None for name in EXCLUSIVE):
            raise DataError(f"give either {' or '.join(EXCLUSIVE)}, not both")

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


PrepareOptions.__doc__ = f"{PrepareOptions.__doc__}\n\n    {prepare_parameter_docs()}\n    "


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
