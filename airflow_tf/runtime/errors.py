"""Errors that refuse a task before it trains. Kept free of TensorFlow so that every role
(a ps task too) can catch them without importing Keras."""

from __future__ import annotations


class ModelError(ValueError):
    """The model reference, its keyword arguments or a checkpoint do not fit; the message says
    which option or file is wrong and what to do."""


class TaskConfigError(ValueError):
    """TF_CONFIG is missing or malformed, or the options do not fit the cluster."""
