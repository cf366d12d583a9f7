"""The Airflow plugin the provider ships (entry point ``airflow.plugins``): TensorBoard over the
storage's ``runs/`` mounted in the API server at ``/tensorboard`` and the Training view at
``/training``, both behind Airflow's login and showing only the runs of the DAGs the user may read
(:mod:`.access`); a ``TensorBoard`` link on the launch task and a ``TensorBoard`` view on each DAG run.

Submodules are imported on their own: :mod:`.links` is light (the launch operator imports it);
:mod:`.tensorboard` is what the API server loads."""
