"""The prepare options' defaults and checks shared by one prepare and its parallel parts, and the
label they name applied to the schema."""

from __future__ import annotations

from .errors import DataError, SchemaError
from .schema import Schema
from .sharding import MAX_SHARDS

DEFAULT_EVAL_FRACTION = 0.2
DEFAULT_BUFFER_MIB = 512.0
COMPRESSIONS = ("gzip", "zlib")


def check_options(eval_fraction: float, shards: int | None, target_shard_mb: float | None,
                  compression: str | None, workers: int | None) -> str | None:
    if not 0 <= float(eval_fraction) < 1:
        raise DataError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    if shards is not None and not 1 <= int(shards) <= MAX_SHARDS:
        raise DataError(f"shards must be between 1 and {MAX_SHARDS:,}, got {shards}")
    if shards is not None and target_shard_mb is not None:
        raise DataError("give either shards or target_shard_mb, not both")
    if target_shard_mb is not None and float(target_shard_mb) <= 0:
        raise DataError(f"target_shard_mb must be positive, got {target_shard_mb}")
    if workers is not None and int(workers) < 1:
        raise DataError(f"workers must be at least 1, got {workers}")
    if compression in (None, "", "none", "NONE"):
        return None
    if str(compression).lower() not in COMPRESSIONS:
        raise DataError(f"compression {compression!r} is not supported; use 'gzip', 'zlib' or none")
    return str(compression).lower()


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
