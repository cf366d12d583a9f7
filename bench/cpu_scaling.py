"""How much more work this machine does on two cores than on one: the ceiling for parts or
workers each bound to a core of their own.

A pure-CPU loop and a memory-bound NumPy loop, each run in one process bound to core 0
alone, then in two processes bound to cores 0 and 1 at once. Prints the ratio of work per
second (2.00x: the cores share nothing that slows them).
Usage: ``.venv/bin/python bench/cpu_scaling.py``
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

import numpy as np


def cpu_loop(core: int) -> float:
    os.sched_setaffinity(0, {core})
    start = time.perf_counter()
    total = 0
    for i in range(20_000_000):
        total += i
    return time.perf_counter() - start


def memory_loop(core: int) -> float:
    os.sched_setaffinity(0, {core})
    values = np.ones((64 << 20) // 8)  # 64 MiB: far larger than the caches
    start = time.perf_counter()
    for _ in range(60):
        values = values * 1.5 - 0.5
    return time.perf_counter() - start


def main() -> int:
    if len(os.sched_getaffinity(0)) < 2:
        print("this process may use one core only: nothing to compare")
        return 1
    for loop in (cpu_loop, memory_loop):
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            alone = pool.apply(loop, (0,))
            both = pool.map(loop, (0, 1))
        print(f"{loop.__name__}: one core {alone:.2f} s, two at once {both[0]:.2f} s / {both[1]:.2f} s: "
              f"{2 * alone / max(both):.2f}x the work per second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
