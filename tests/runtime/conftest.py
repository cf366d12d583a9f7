"""Training groups for the runtime tests, launched through the local backend (the one launcher)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from processes import kill_leftovers

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.wait import run_group
from airflow_tf.cluster import GroupSpec, TrainingConfig

GROUP_TIMEOUT = 240.0
"""Seconds a test group may take; generous, because other work may share the two cores."""


@dataclass
class Run:
    config: TrainingConfig
    succeeded: bool
    report: str | None
    logs: dict[str, str]
    """Each task's log by ``role-index``."""

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run_dir)

    def lines(self, task: str, prefix: str) -> list[str]:
        """The task's log lines that contain ``prefix``."""
        return [line for line in self.logs[task].splitlines() if prefix in line]


def train_group(name: str, dataset: str, run_dir: Path, state_dir: Path, *, ps: int = 1, workers: int = 2,
                chief: int = 0, evaluator: int = 0, on_status=None, group_options: dict | None = None,
                **training) -> Run:
    """Launch a group, wait for its workers, tear it down; returns its logs. Checks that no
    runtime process of the group is left. ``on_status`` sees every status while it runs;
    ``group_options`` are GroupSpec's."""
    options = dict(batch_size=32, learning_rate=0.1, checkpoint_every_secs=1.0, log_every_secs=0.5)
    options.update(training)
    config = TrainingConfig(dataset=dataset, run_dir=str(run_dir), **options)
    spec = GroupSpec.for_training(name, config, ps=ps, workers=workers, chief=chief, evaluator=evaluator,
                                  active_deadline_seconds=GROUP_TIMEOUT, **(group_options or {}))
    logs_dir = state_dir / f"{name}-logs"
    result = run_group(LocalBackend(state_dir), spec, logs_dir=logs_dir, on_status=on_status)
    logs = {
        re.sub(rf"^{re.escape(name)}-", "", path.stem): path.read_text() for path in logs_dir.glob("*.log")
    }
    assert kill_leftovers(state_dir) == [], "a process of the group outlived it"
    return Run(config, result.outcome.succeeded, result.report, logs)


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    """``train(name, dataset, run_dir, ps=1, workers=2, **training options) -> Run``."""
    state_dir = tmp_path_factory.mktemp("groups")
    return lambda name, dataset, run_dir, **options: train_group(name, dataset, run_dir, state_dir, **options)
