"""Streaming prepare in bounded memory: an input several times larger than the memory the
prepare may use is converted completely, every row checked afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

# Runs in a fresh process: the peak resident memory (VmHWM) is reset after the imports, so it
# measures what the prepare itself takes.
MEASURE = r'''
import json, sys
from airflow_tf.data.prepare import prepare_dataset
import pyarrow.csv, pyarrow.compute, numpy

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

# A first, tiny prepare starts the thread pools and loads what the libraries load lazily: the
# peak below is then what the data costs.
warm = sys.argv[2] + "-warm.csv"
with open(warm, "w") as handle:
    handle.write("id,y\n" + "".join(f"{i},{i % 2}\n" for i in range(1000)))
prepare_dataset(warm, sys.argv[2] + "-warm", "warm", label="y", encode_threads=2, compression="gzip")
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # reset the peak resident set size to the current one
before = status("VmRSS")
summary = prepare_dataset(sys.argv[1], sys.argv[2], "big", label="y", buffer_mib=float(sys.argv[3]),
                          encode_threads=2, compression="gzip")
print(json.dumps({"before": before, "peak": status("VmHWM"), "summary": summary}))
'''

ROWS = 1_600_000
FLOATS = 8


def _write_big_csv(path: Path) -> None:
    with pacsv.CSVWriter(path, pa.schema([("id", pa.int64())] + [(f"f{k}", pa.float64()) for k in range(FLOATS)]
                                         + [("y", pa.int64())])) as out:
        for start in range(0, ROWS, 200_000):
            ids = np.arange(start, min(ROWS, start + 200_000))
            columns = {"id": ids, **{f"f{k}": ids / 8 + k for k in range(FLOATS)}, "y": ids % 2}
            out.write_table(pa.table(columns))


@pytest.mark.slow
def test_an_input_larger_than_the_memory_allowed_is_prepared_completely(tmp_path, read_split):
    source = tmp_path / "big.csv"
    _write_big_csv(source)
    # What the prepare may add to a warmed-up process with buffer_mib=8: measured 43 MiB here
    # (two read blocks, the encoding tasks in flight and their temporaries, pyarrow's pool).
    limit = 64 << 20
    assert source.stat().st_size > 2 * limit
    done = subprocess.run([sys.executable, "-c", MEASURE, str(source), str(tmp_path / "out"), "8"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    grew = result["peak"] - result["before"]
    assert grew <= limit, f"prepare took {grew / 2**20:.0f} MiB for a {source.stat().st_size / 2**20:.0f} MiB input"

    summary = result["summary"]
    assert summary["rows"] == ROWS and sum(summary["counts"].values()) == ROWS
    ids = []
    for split in ("train", "eval"):
        rows = read_split(summary["dataset_uri"], split)
        for k in range(FLOATS):
            np.testing.assert_array_equal(rows[f"f{k}"], (rows["id"] / 8 + k).astype(np.float32))
        np.testing.assert_array_equal(rows["y"], rows["id"] % 2)
        ids.append(rows["id"])
    np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(ROWS))
