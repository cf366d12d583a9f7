"""What runs inside each ps/worker process or pod: ``python -m airflow_tf.runtime``.

Imports TensorFlow (lazily), ``airflow_tf.cluster`` and ``airflow_tf.data``; never Airflow, so
the training image needs no Airflow. The model API shared with evaluation and export is in
:mod:`airflow_tf.runtime.models`."""
