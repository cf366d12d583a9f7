"""What runs inside each ps/worker process or pod. Imports TensorFlow, never Airflow."""
