"""``python -m airflow_tf.runtime <training options>``: run the task TF_CONFIG names."""

from .main import run_task_process

run_task_process()
