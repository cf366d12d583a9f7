"""What building the images costs: a cold build against a cached one, in the same run.

Cold: ``scripts/images build IMAGE ...`` into an empty store of its own (a temporary
XDG_CACHE_HOME), so every base is made too (mmdebstrap's Debian, the stand-ins, then the images:
downloads from Debian and PyPI included). Cached: the same command again, which finds every
build current by its inputs hash. Prints each image's build time as the script logs it, both
totals and their ratio, and each image's size in the store; the temporary store is removed.

``.venv/bin/python bench/bench_images.py [--images training,airflow]``
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "scripts" / "images"
BUILT = re.compile(r"^images: built (\S+) in (\d+) s$", re.M)


def run_build(names: list[str], env: dict[str, str]) -> tuple[float, list[tuple[str, int]]]:
    start = time.monotonic()
    done = subprocess.run([str(IMAGES), "build", *names], env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode:
        raise SystemExit(f"scripts/images build failed:\n{done.stderr[-3000:]}")
    return wall, [(ref, int(seconds)) for ref, seconds in BUILT.findall(done.stderr)]


def size_mb(ref: str, env: dict[str, str]) -> float:
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", ref], env=env, check=True,
                         capture_output=True, text=True).stdout
    return int(out.strip()) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", default="training,airflow", help="comma-separated (scripts/images list)")
    args = parser.parse_args(argv)
    names = args.images.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-images-", dir="/var/tmp") as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        try:
            cold, built = run_build(names, env)
            cached, rebuilt = run_build(names, env)
            store = dict(line.removeprefix("export ").split("=", 1) for line in subprocess.run(
                [str(IMAGES), "env"], env=env, check=True, capture_output=True, text=True).stdout.splitlines())
            podman_env = {**env, **{k: v.strip("'") for k, v in store.items()}}
            print(f"{len(os.sched_getaffinity(0))} cores; images {', '.join(names)} and their bases, "
                  f"an empty store in {cache}")
            print(f"{'image':55} {'cold build s':>12} {'size MB':>9}")
            for ref, seconds in built:
                print(f"{ref:55} {seconds:12d} {size_mb(ref, podman_env):9.0f}")
            print(f"total: cold {cold:.0f} s, cached {cached:.1f} s ({len(rebuilt)} rebuilt); "
                  f"cached / cold: {cached / cold:.4f}x")
        finally:
            subprocess.run([str(IMAGES), "remove"], env=env, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
