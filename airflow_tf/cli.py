"""``airflow-tf``: prepare datasets, run a training group without Airflow, render
Kubernetes manifests, and run the demo DAG. This module only parses arguments; the work is
done by the rooms below it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


# -- prepare ------------------------------------------------------------------------------
def _add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="convert CSV/Parquet/NumPy files into a sharded TFRecord dataset")
    p.set_defaults(func=_cmd_prepare)


def _cmd_prepare(args: argparse.Namespace) -> int:
    raise SystemExit("airflow-tf prepare: not available yet")


# -- run ----------------------------------------------------------------------------------
def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="train on a local parameter-server/worker group (no Airflow)")
    p.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    raise SystemExit("airflow-tf run: not available yet")


# -- render -------------------------------------------------------------------------------
def _add_render(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("render", help="print the Kubernetes manifests of a group (for kubectl apply -f -)")
    p.set_defaults(func=_cmd_render)


def _cmd_render(args: argparse.Namespace) -> int:
    raise SystemExit("airflow-tf render: not available yet")


# -- demo ---------------------------------------------------------------------------------
def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the demo end to end on the embedded default")
    p.add_argument("--workdir", required=True, help="directory for data, runs, models and AIRFLOW_HOME")
    p.add_argument("--dags-folder", default=None, help="the example DAGs (default: the repository's dags/)")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from airflow_tf.demo import REPO_DAGS, run_demo

    _print_json(run_demo(args.workdir, args.dags_folder or REPO_DAGS))
    return 0


SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (_add_prepare, _add_run, _add_render, _add_demo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="airflow-tf", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
