"""``python -m airflow_tf.runtime <training options>``: run the task TF_CONFIG names."""

import os
import sys

from .main import main, remove_own_temporary_directory, use_own_temporary_directory

use_own_temporary_directory()
try:
    code = main()
finally:
    remove_own_temporary_directory()
sys.stdout.flush()
sys.stderr.flush()
# Everything the task writes (checkpoints, events, progress.json, its log) is closed by now;
# skipping the interpreter's teardown of TensorFlow saves a second or two of idle per task.
os._exit(code)
