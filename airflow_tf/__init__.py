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
                "description": "Shared storage and local group state of airflow-tf training tasks. "
                "Read when a task runs; when unset, the environment variables AIRFLOW_TF_STORAGE and "
                "AIRFLOW_TF_STATE_DIR apply.",
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
                    "state_dir": {
                        "description": "Where the local backend keeps the state and logs of its groups. "
                        "Empty: $AIRFLOW_TF_STATE_DIR, else ~/.cache/airflow-tf/groups.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/var/lib/airflow-tf/groups",
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
