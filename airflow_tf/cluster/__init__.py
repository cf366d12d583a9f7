"""What a training group is. Pure Python: imports neither Airflow nor TensorFlow."""

from .names import dns1123_label, group_name, label_value, path_component, task_name
from .spec import DEFAULT_SUCCESS_POLICY, ROLES, GroupSpec, HealthBounds, RoleSpec, SpecError, describe_exit, is_retryable_exit, task_failure_reason
from .status import ALL_WORKERS, CHIEF_OR_WORKER0, SUCCESS_POLICIES, GroupStatus, Outcome, OutcomeCode, Phase, ReasonCode, TaskStatus, evaluate, group_outcome
from .tf_config import cluster_def, tf_config, tf_config_json
from .training import TrainingConfig

__all__ = [
    "ALL_WORKERS", "CHIEF_OR_WORKER0", "DEFAULT_SUCCESS_POLICY", "ROLES", "SUCCESS_POLICIES", "GroupSpec", "GroupStatus", "HealthBounds", "Outcome", "OutcomeCode", "Phase", "ReasonCode", "RoleSpec", "SpecError", "TaskStatus",
    "TrainingConfig", "cluster_def", "describe_exit", "dns1123_label", "evaluate", "group_name", "group_outcome",
    "is_retryable_exit", "label_value", "path_component", "task_failure_reason", "task_name", "tf_config", "tf_config_json",
]
