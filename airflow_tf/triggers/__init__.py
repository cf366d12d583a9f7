"""Async triggers for deferrable waiting on the triggerer."""

from .worker_completion import WorkerCompletionTrigger

__all__ = ["WorkerCompletionTrigger"]
