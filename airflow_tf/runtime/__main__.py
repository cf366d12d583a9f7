"""``python -m airflow_tf.runtime <training options>``: run the task TF_CONFIG names."""

import sys

from .task import main

sys.exit(main())
