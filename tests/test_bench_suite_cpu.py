"""bench/suite_cpu.py charges the CPU a command's processes use to their kind of process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "suite_cpu.py"
BUSY = "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass\n"


def test_a_busy_child_of_the_command_is_charged_to_its_kind(tmp_path):
    out = tmp_path / "cpu.json"
    # The command's own child, named as a TensorFlow task would be, burns 1.5 s of CPU; its
    # dataset is in a folder named as a real node's binary is.
    command = [sys.executable, "-c", f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', "
               f"{BUSY!r}, '-m', 'airflow_tf.runtime', '--dataset', '/tmp/kubelet/d']))"]
    result = subprocess.run([sys.executable, str(SCRIPT), "--interval", "0.2", "--out", str(out), "--", *command],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    table = json.loads(out.read_text())
    assert 1.3 <= table["by_kind_cpu_s"]["tensorflow task (?)"] <= 2.5, table
    assert table["processes_by_kind"]["tensorflow task (?)"] == 1, table
    assert "tensorflow task (?)" in result.stderr and "the machine was busy" in result.stderr
    # ... and listed among the commands that used the most CPU, in a few words.
    [top] = [row for row in table["top_commands"] if row["kind"] == "tensorflow task (?)"]
    assert top["command"].startswith("python") and "import time" in top["command"], top
    assert 1.3 <= top["cpu_s"] <= 2.5, top
