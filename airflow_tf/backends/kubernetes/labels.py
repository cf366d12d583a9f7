"""The labels and annotations the Kubernetes backend puts on a group's objects: the group/role
labels find and count tasks; the annotations carry what status() needs to judge the group
without the spec."""

PREFIX = "airflow-tf"
GROUP_LABEL = f"{PREFIX}/group"
ROLE_LABEL = f"{PREFIX}/role"
COMPONENT_LABEL = f"{PREFIX}/component"
ONE_OFF_LABEL = f"{PREFIX}/one-off"
"""On a one-off Job (evaluation, export, a prepare part) and its pod: the Job's name."""
ROOT_ANNOTATION = f"{PREFIX}/root"
SCHEDULE_TIMEOUT = f"{PREFIX}/schedule-timeout-seconds"
SUCCESS_POLICY = f"{PREFIX}/success-policy"
REPLICAS = f"{PREFIX}/replicas"
RESTART_POLICY = f"{PREFIX}/restart-policy"
# Set by the Job controller on every pod of an Indexed Job (label since Kubernetes 1.28).
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""The Job controller's label on each pod: the Job it belongs to."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
"""A Kueue WorkloadPriorityClass: how Kueue orders and preempts the Workloads of its queues."""
