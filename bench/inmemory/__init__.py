"""The whole-input-in-memory prepare path (airflow_tf.data before streaming, commit 6270750),
kept only as the baseline that bench/bench_prepare.py measures the streaming path against.
Not part of the package and not used by anything else."""
