"""The worker-count sensor."""

from .worker_completion import TrainingGroupFailed, WorkerCompletionSensor

__all__ = ["TrainingGroupFailed", "WorkerCompletionSensor"]
