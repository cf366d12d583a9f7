"""bench/cpu_per_test.py charges each test the CPU of everything it started, daemons included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "cpu_per_test.py"

TESTS = '''
import os, subprocess, sys, time
from pathlib import Path

BUSY = "import time\\nend = time.process_time() + 1.5\\nwhile time.process_time() < end: pass\\n" \\
       "open(__import__('sys').argv[1], 'w').close()\\n"


def test_a_daemon_burns_cpu(tmp_path):
    # Started in a new session by a child that exits at once: no longer the test's descendant.
    done = tmp_path / "done"
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                    f"{BUSY!r}, {str(done)!r}], start_new_session=True)"], check=True)
    while not done.exists():
        time.sleep(0.05)


def test_idle():
    time.sleep(0.5)
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="making a control group needs root")
def test_a_daemon_started_by_a_test_is_charged_to_that_test(tmp_path):
    (tmp_path / "test_sample.py").write_text(TESTS)
    out = tmp_path / "cpu.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--", str(tmp_path / "test_sample.py"),
                             "-q", "--rootdir", str(tmp_path)], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = json.loads(out.read_text())
    cpu = {row["test"].split("::")[-1]: row["cpu_s"] for row in table["tests"]}
    assert 1.3 <= cpu["test_a_daemon_burns_cpu"] <= 3.0, table
    assert cpu["test_idle"] < 0.3, table
    assert table["tests"][0]["test"].endswith("test_a_daemon_burns_cpu"), "the costliest test comes first"
    assert "test_a_daemon_burns_cpu" in result.stderr and "by file" in result.stderr


def test_a_negative_top_is_refused():
    result = subprocess.run([sys.executable, str(SCRIPT), "--top", "-1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--top must be 0 or more" in result.stderr
