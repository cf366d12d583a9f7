"""Errors of the data layer. Each message names the file, row, column or path at fault and
what to do about it; all derive from :class:`DataError` (a ``ValueError``)."""

from __future__ import annotations


class DataError(ValueError):
    """Bad input, a bad schema, or a dataset that cannot be read or written."""


class InputDataError(DataError):
    """The raw input (CSV, Parquet, .npz) is missing, empty or holds a bad value."""


class SchemaError(DataError):
    """A schema (declared or stored) is malformed or does not match the input."""


class DatasetExistsError(DataError):
    """The dataset version already exists and overwriting was not asked for."""


class DatasetNotReadyError(DataError):
    """The dataset directory is missing or has no ``_SUCCESS`` marker (not fully written)."""
