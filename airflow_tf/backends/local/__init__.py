"""The local backend: every task of a group is a process on 127.0.0.1, under a detached
supervisor per group.

- :mod:`.backend`: :class:`LocalBackend` (launch, status, logs, teardown), what the Airflow side
  and the CLI call; it starts a group's supervisor and reads back the state that one writes.
- :mod:`.supervisor`: ``python -m airflow_tf.backends.local.supervisor``, the group's tasks
  started, restarted and stopped; :mod:`.watch`: its watchdog and health questions.
- :mod:`.forkserver`: the supervisor's side of the group's fork server.
- :mod:`.processes`, :mod:`.memory`, :mod:`.files`, :mod:`.network`: processes by pid and
  start time, admission by memory, a group's directory, its private network namespace.
"""

from .backend import OPTIONS, LocalBackend

__all__ = ["OPTIONS", "LocalBackend"]
