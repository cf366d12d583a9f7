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
        "integrations": [
            {
                "integration-name": "TensorFlow",
                "external-doc-url": "https://www.tensorflow.org/",
                "tags": ["software"],
            }
        ],
    }
