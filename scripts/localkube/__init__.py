"""The private Kubernetes plane of ``scripts/kube`` (its entry point; ``cli`` holds the commands and
their help), by job: ``build`` (the Go builds), ``plane`` (the control plane, ``up`` and ``down``),
``nodes`` (real nodes and their life), ``host`` (what the nodes change on the host, and its undoing),
``images`` (the images the nodes load), ``kueue`` (Kueue and JobSet), ``api`` (calls to the API
server), ``process`` (the components' processes). Developer tooling: not part of the wheel.

Only the standard library, and ``airflow_tf.plane_env`` (the DIR/env format, which the shipped demo
reads too), so it runs before any environment exists.
"""
