"""airflow-tf: distributed TensorFlow parameter-server training as Apache Airflow DAGs."""

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "airflow-tf",
        "name": "TensorFlow training (airflow-tf)",
        "description": "Prepare TFRecords, run a TensorFlow parameter-server/worker group, "
        "wait for it, tear it down, evaluate and export a SavedModel.",
        "versions": [__version__],
        "operators": [
            {"integration-name": "TensorFlow", "python-modules": ["airflow_tf.operators"]},
        ],
        "sensors": [
            {"integration-name": "TensorFlow", "python-modules": ["airflow_tf.sensors"]},
        ],
        "triggers": [
            {"integration-name": "TensorFlow", "python-modules": ["airflow_tf.triggers"]},
        ],
        "config": {
            "airflow_tf": {
                "description": "Shared storage, the default backend and the local group state of "
                "airflow-tf training tasks. Read when a task runs; when unset, the environment variables "
                "AIRFLOW_TF_STORAGE, AIRFLOW_TF_BACKEND, AIRFLOW_TF_BACKEND_OPTIONS and AIRFLOW_TF_STATE_DIR apply.",
                "options": {
                    "storage": {
                        "description": "Root of the shared storage: datasets/, runs/ and models/ (the "
                        "TensorFlow Serving base path). The same path on every Airflow worker and training "
                        "task (a shared volume or PVC). Empty: $AIRFLOW_TF_STORAGE, else ~/airflow-tf.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/shared/airflow-tf",
                        "default": "",
                    },
                    "backend": {
                        "description": "The backend of trainings whose DAG names none (backend=None, the "
                        "default of tf_training and the launch): local or kubernetes. Empty: "
                        "$AIRFLOW_TF_BACKEND, else local.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "kubernetes",
                        "default": "",
                    },
                    "backend_options": {
                        "description": "That backend's options as a JSON object, for trainings that give "
                        "none (e.g. the namespace and the storage claim of the pods). Empty: "
                        "$AIRFLOW_TF_BACKEND_OPTIONS, else none.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": '{"namespace": "ml", "pod_defaults": {"volumes": [{"claim": '
                        '"airflow-tf-storage", "mount_path": "/shared/airflow-tf"}]}}',
                        "default": "",
                    },
                    "teams": {
                        "description": "Airflow's multi-team mode: each team's storage root, a JSON object "
                        "of team name to {\"storage\": root}. A task of a team's DAG run uses its team's root "
                        "(and <root>/groups for its local groups' state); a task of no team, or of a team left "
                        "out, is refused. Give each team's workers and pods write access to their own root "
                        "only (docs: explanation/security). Empty: $AIRFLOW_TF_TEAMS, else one shared storage.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": '{"team_a": {"storage": "/shared/team_a"}, "team_b": {"storage": '
                        '"/shared/team_b"}}',
                        "default": "",
                    },
                    "state_dir": {
                        "description": "Where the local backend keeps the state and logs of its groups. "
                        "Empty: $AIRFLOW_TF_STATE_DIR, else ~/.cache/airflow-tf/groups.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/var/lib/airflow-tf/groups",
                        "default": "",
                    },
                    "kept_log_bytes": {
                        "description": "How much of each training task's log (its end, whole lines) is kept "
                        "in the run directory (<run_dir>/logs/) when its group's processes or pods are deleted. "
                        "Empty: $AIRFLOW_TF_KEPT_LOG_BYTES, else 10485760 (10 MiB).",
                        "version_added": "0.2.0",
                        "type": "integer",
                        "example": "1048576",
                        "default": "",
                    },
                },
            },
        },
        "integrations": [
            {
                "integration-name": "TensorFlow",
                "external-doc-url": "https://www.tensorflow.org/",
                "tags": ["software"],
            }
        ],
    }
