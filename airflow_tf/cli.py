"""The ``airflow-tf`` command: argument parsing and the texts a user reads; each command calls
the library (``airflow_tf.data``, ``airflow_tf.backends``, ``airflow_tf.serving``) for its work.

Each command writes its result alone on stdout (JSON; ``render``: YAML manifests) and everything
else on stderr, so its output can be redirected to a file and read by the next command."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from typing import Any, TextIO
from collections.abc import Callable, Iterator

from airflow_tf import __version__
from airflow_tf.cluster.declarations import flag_name
from airflow_tf.cluster.group_options import OPTIONS as GROUP_OPTIONS
from airflow_tf.cluster.group_options import add_group_arguments, group_options_of
from airflow_tf.cluster.training import add_training_arguments, json_argument
from airflow_tf.data.options import RENAMED, PrepareOptions, add_prepare_arguments
from airflow_tf.deprecation import REMOVED_IN
from airflow_tf.files import read_json


DESCRIPTION = (
    "Train TensorFlow models on a parameter-server/worker group without Airflow, with the same steps the "
    "airflow-tf operators run in a DAG: prepare a sharded TFRecord dataset from CSV, Parquet or NumPy files, "
    "train on local processes, evaluate the result and export it for TensorFlow Serving, print the "
    "Kubernetes manifests of a group, or run the demo DAG end to end. Each command prints its result "
    "(JSON, or YAML for render) on stdout and its progress on stderr."
)


def _print_json(data: Any, out: TextIO) -> None:
    json.dump(data, out, indent=2, sort_keys=True, default=str)
    out.write("\n")


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """While a command runs, whatever is written to stdout goes to stderr: the library's log lines
    (a training task's stdout is its log, see :mod:`airflow_tf.runtime.logs`), Keras, TensorFlow's
    C++ code and child processes alike (file descriptor 1 itself is pointed at stderr), so the
    command's result is all its stdout carries."""
    stdout = sys.stdout
    stdout.flush()
    try:
        saved: int | None = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptor 1 or 2 (closed by the caller): Python's own writes are still moved
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        stdout.flush()  # writes through a reference to stdout kept from before go to stderr too
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


_LEADING_NAME = re.compile(r"^(\s*)([\w.\[\]/-]+)(?=: | must )", re.MULTILINE)
_BACKEND_OPTION = re.compile(r"backend_options=\{'(\w+)': '([^']*)'\}(?: \(airflow-tf \w+ [^)]*\))?")
_ASSIGNED = re.compile(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+)*)=(?:'([^']*)'|True\b)")
_SNAKE = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
_ROLE_COUNT_FLAGS = {"ps": "--ps", "worker": "--workers"}
_VOLUME_FLAGS = "--data-claim/--runs-claim"
_OPTION_FLAGS = {"role_options": "--cpu/--memory"}


def _naming_flags(message: str, args: argparse.Namespace) -> str:
    """The library's message in the command line's words: each parameter it names (``queue_name:
    ...``, ``roles.ps.kubernetes.shm_size: ...``, ``backend_options={'workload': 'jobset'}``,
    ``workload='jobs'``) named as the flag the user typed (``--queue-name``, ``--shm-size``,
    ``--workload jobset``). A name no flag of this command sets stays as it is."""
    flags = {name for name in vars(args) if name not in ("func", "command")}

    def flag(name: str) -> str | None:
        if name in _OPTION_FLAGS and name not in flags and "cpu" in flags:
            return _OPTION_FLAGS[name]
        if name in GROUP_OPTIONS and flag_name(GROUP_OPTIONS[name])[2:].replace("-", "_") in flags:
            return flag_name(GROUP_OPTIONS[name])  # a flag named otherwise: --deadline
        return "--" + name.replace("_", "-") if name in flags else None

    def path_flag(path: str) -> str | None:
        """The flag of a parameter path: ``training.<option>``, ``roles.<role>.replicas``,
        ``roles.<role>.kubernetes.<key>...``, ``roles.<role>.resources.<kind>.<resource>``."""
        parts = re.split(r"[.\[]", path)
        if parts[0] == "training" and len(parts) == 2:
            return flag(parts[1])
        if parts[0] != "roles" or len(parts) < 3:
            return flag(path)
        role, what, key = parts[1], parts[2], (parts[3:] or [""])[0]
        resource = (parts[4:] or [""])[0]
        named = {
            "replicas": lambda: _ROLE_COUNT_FLAGS.get(role),
            "kubernetes": lambda: _VOLUME_FLAGS if key == "volumes" else flag(key),
            "resources": lambda: flag(f"{role}_gpus") if "gpu" in path else (
                f"--{resource} {role}" if resource in ("cpu", "memory") and resource in flags else None),
        }
        return named[what]() if what in named else None

    def leading(match: re.Match) -> str:
        whole = path_flag(match.group(2))
        named = [whole] if whole else [path_flag(name) for name in match.group(2).split("/")]
        return match.group(1) + "/".join(str(n) for n in named) if all(named) else match.group(0)

    message = _LEADING_NAME.sub(leading, message)
    message = _BACKEND_OPTION.sub(lambda m: f"{flag(m.group(1)) or m.group(0)} {m.group(2)}"
                                  if flag(m.group(1)) else m.group(0), message)
    message = _ASSIGNED.sub(lambda m: " ".join(filter(None, (flag(m.group(1)), m.group(2))))
                            if flag(m.group(1)) else m.group(0), message)
    return _SNAKE.sub(lambda m: flag(m.group(0)) or m.group(0), message)


def _fail(command: str, err: BaseException, args: argparse.Namespace) -> SystemExit:
    """The exit of a command whose options the library refused, its message naming the flags."""
    return SystemExit(f"airflow-tf {command}: {_naming_flags(str(err), args)}")


# -- prepare ------------------------------------------------------------------------------
def _add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare", help="convert CSV/Parquet/NumPy files into a sharded TFRecord dataset",
        description="Convert CSV, Parquet or .npz files into <output>/<name>/<version>/{train,eval}/"
        "part-NNNNN-of-MMMMM.tfrecord[.gz] with schema.json and a _SUCCESS marker, and print a JSON "
        "summary (dataset URI, counts per split) on stdout.",
    )
    p.add_argument("--input", required=True, action="append",
                   help="input file, directory or glob (quote it: 'data/*.csv'); may be repeated")
    p.add_argument("--output", required=True, help="datasets directory (the dataset goes under <output>/<name>/)")
    p.add_argument("--name", required=True, help="dataset name")
    p.add_argument("--version", help="dataset version (default: the next integer after the existing ones)")
    add_prepare_arguments(p, vocabularies=_vocabularies_arg)
    p.add_argument("--overwrite", action="store_true", help="replace the version if it exists")
    p.add_argument("--cache", action="store_true",
                   help="reuse the version made from the same input content and options instead of encoding again")
    p.add_argument("--partition-key", metavar="KEY",
                   help="the data partition this input is (e.g. a day): the version is named by it")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=_cmd_prepare)


def _vocabularies_arg(text: str) -> Any:
    """``--vocabularies``: column names separated by commas (as the operator takes them), or JSON
    (inline or @FILE); ``prepare_dataset`` checks them against the input's columns."""
    if not text.lstrip().startswith(("{", "[", "@")):
        return text
    return json_argument('an object of sizes (\'{"user": 50000}\') or a list of columns', (dict, list))(text)


def _renamed_flags(command: str, args: argparse.Namespace) -> None:
    """A flag given by its deprecated name counts as the new one, and stderr says so."""
    for old, new in RENAMED.items():
        if getattr(args, old, None) is not None:
            print(f"airflow-tf {command}: --{old.replace('_', '-')} is deprecated and will be removed in airflow-tf "
                  f"{REMOVED_IN}: use --{new.replace('_', '-')}", file=sys.stderr, flush=True)
            if getattr(args, new) is None:
                setattr(args, new, getattr(args, old))


def _cmd_prepare(args: argparse.Namespace, out: TextIO) -> int:
    from airflow_tf.data import DataError, prepare_dataset

    def show(progress: Any) -> None:
        print(progress.describe(), file=sys.stderr, flush=True)

    _renamed_flags("prepare", args)
    try:
        options = PrepareOptions(**{name: getattr(args, name) for name in PrepareOptions.names()})
        summary = prepare_dataset(
            args.input, args.output, args.name, options=options, version=args.version, overwrite=args.overwrite,
            cache=args.cache, partition_key=args.partition_key, progress=None if args.quiet else show,
        )
    except DataError as err:
        raise _fail("prepare", err, args) from err
    _print_json(summary, out)
    return 0


# -- run ----------------------------------------------------------------------------------
RUN_GROUP_OPTIONS = ("ps", "workers", "backoff_limit", "active_deadline_seconds", "progress_timeout",
                     "health_timeout", "pass_env")
"""The group options ``airflow-tf run`` has a flag for, in the order its help lists them."""
RENDER_GROUP_OPTIONS = ("ps", "workers", "port")
"""The group options ``airflow-tf render`` has a flag for."""


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="train on a local parameter-server/worker group (no Airflow)",
        description="Launch a parameter-server/worker group as local processes, show its progress, stop "
        "the parameter servers when the workers are done and print a JSON summary. Ctrl-C or SIGTERM "
        "tears the whole group down.",
    )
    add_training_arguments(p, run_dir=None)
    add_group_arguments(p, "ps", "workers")
    p.add_argument("--name", default=None, help="group name (default run-<date>-<time>-<pid>)")
    add_group_arguments(p, "backoff_limit", "active_deadline_seconds")
    p.add_argument("--state-dir", default=None, help="where groups keep their state (default $AIRFLOW_TF_STATE_DIR)")
    add_group_arguments(p, "progress_timeout", "health_timeout", "pass_env")
    p.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    import logging
    import os
    import signal
    import time

    from airflow_tf.backends import BackendError
    from airflow_tf.backends.local import LocalBackend
    from airflow_tf.backends.wait import run_group
    from airflow_tf.cluster import SpecError
    from airflow_tf.cluster.progress import describe

    name = args.name or time.strftime("run-%Y%m%d-%H%M%S-") + str(os.getpid())
    run_dir = os.path.abspath(args.run_dir or os.path.join("airflow-tf-runs", name))
    started, started_at = time.monotonic(), time.time()
    spec = _run_spec(args, name, run_dir)

    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: Any) -> None:
        # Once: the teardown that follows must not be interrupted in turn.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Interrupted(signal.Signals(signum).name)

    shown: dict[str, str | None] = {"line": None}

    def show(status: Any) -> None:
        counts = status.counts().get("worker", {})
        line = f"{describe(status.progress)}; workers running {counts.get('Running', 0)}, done {counts.get('Succeeded', 0)}"
        if line != shown["line"]:
            shown["line"] = line
            print(f"[{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    def launched(ref: Any) -> None:
        logs["dir"] = str(backend.logs_dir(ref))
        print(f"launched group {ref.name}: {args.ps} ps, {args.workers} worker(s); run dir {run_dir}",
              file=sys.stderr, flush=True)

    # The backend's warnings (no network isolation, more workers than cores) go to stderr.
    logging.basicConfig(level=logging.WARNING, format="airflow-tf run: warning: %(message)s", stream=sys.stderr)
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    backend = LocalBackend(args.state_dir)
    # Each attempt's logs are copied to <run_dir>/logs/attempt-<N>/ when its group is deleted.
    logs = {"dir": os.path.join(run_dir, "logs")}
    try:
        result = run_group(backend, spec, owner_pid=os.getpid(), on_status=show, on_launched=launched)
    except Interrupted as sig:
        print(f"airflow-tf run: {sig}: group {name} torn down; task logs in {logs['dir']}", file=sys.stderr)
        return 128 + signal.Signals[str(sig)].value
    except (SpecError, BackendError, ValueError) as err:  # includes a dataset without _SUCCESS
        raise _fail("run", err, args) from err
    _record_launch(run_dir, spec, result.ref)
    _print_json(_run_summary(result, name, run_dir, logs["dir"], started=started, started_at=started_at), out)
    return 0 if result.outcome.succeeded else 1


def _run_spec(args: argparse.Namespace, name: str, run_dir: str) -> Any:
    """The group spec of ``airflow-tf run`` (the user's model code copied into the run dir when it
    is a module of theirs); bad options exit with the message."""
    import dataclasses

    from airflow_tf.cluster import GroupSpec, TrainingConfig
    from airflow_tf.cluster.model_code import snapshot_model_code

    try:
        training = TrainingConfig.from_namespace(args, dataset=os.path.abspath(args.dataset), run_dir=run_dir)
        if training.code_dir is None:  # a model module of the user's travels with the run (cwd as `python -m`)
            code = snapshot_model_code(training.model, run_dir, [*sys.path, os.getcwd()])
            if code is not None:
                training = dataclasses.replace(training, code_dir=code.path)
                print(f"model code of {training.model} copied to {code.path} (sha256 {code.sha256})", file=sys.stderr)
        return GroupSpec.for_training(name, training, **group_options_of(args, *RUN_GROUP_OPTIONS))
    except ValueError as err:  # SpecError and bad training options
        raise _fail("run", err, args) from err


def _run_summary(result: Any, name: str, run_dir: str, logs_dir: str, *, started: float,
                 started_at: float) -> dict[str, Any]:
    """The JSON summary ``airflow-tf run`` prints; a failure's report goes to stderr."""
    import time

    final = _final_progress(run_dir) or {}
    if final.get("time", 0) < started_at:  # left by an earlier run in the same run dir
        final = result.status.progress or {}
    summary = {
        "group": name, "succeeded": result.outcome.succeeded, "reason": result.outcome.reason,
        "reason_code": str(result.outcome.code),
        "global_step": final.get("global_step"), "loss": final.get("loss"), "checkpoint": final.get("checkpoint"),
        "run_dir": run_dir, "logs": logs_dir, "elapsed_seconds": round(time.monotonic() - started, 2),
    }
    if result.report:
        failed = result.outcome.failed_task
        summary["failed_task"] = None if failed is None else failed.name
        print(result.report, file=sys.stderr)
    return summary


LAUNCH_FILE = "launch.json"


def _record_launch(run_dir: str, spec: Any, ref: Any) -> None:
    """``<run_dir>/launch.json``: what a launch task returns (a LaunchResult), so ``airflow-tf
    evaluate`` and ``export`` find the run's dataset and training options as the operators do."""
    from airflow_tf.cluster.results import LaunchResult
    from airflow_tf.files import write_json

    result = LaunchResult(group=ref.to_dict(), run_dir=spec.training.run_dir, dataset=spec.training.dataset,
                          training=spec.training.to_dict())
    write_json(os.path.join(run_dir, LAUNCH_FILE), result.to_dict())


def _final_progress(run_dir: str) -> Any:
    """The chief's ``progress.json`` (final step, loss, checkpoint), or None."""
    try:
        return read_json(os.path.join(run_dir, "progress.json"), missing_ok=True)
    except ValueError:  # not JSON: the summary then takes the last status's progress
        return None


# -- evaluate and export -------------------------------------------------------------------
def _add_run_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", required=True,
                   help=f"the run directory of `airflow-tf run` (its {LAUNCH_FILE} gives the dataset and the "
                   "training options)")
    p.add_argument("--launch", type=json_argument("a launch result object (a launch task's XCom)", dict),
                   default=None, metavar="JSON|@FILE",
                   help=f"a launch result instead of <run-dir>/{LAUNCH_FILE} (a launch task's XCom)")


def _launch_of(args: argparse.Namespace, command: str) -> Any:
    from airflow_tf.cluster.results import LaunchResult

    data = args.launch
    if data is None:
        path = os.path.join(args.run_dir, LAUNCH_FILE)
        try:
            data = read_json(path)
        except FileNotFoundError as err:
            raise SystemExit(f"airflow-tf {command}: {path} does not exist: give the run directory of "
                             "`airflow-tf run`, or the launch result with --launch") from err
        except ValueError as e:
            raise SystemExit(f"airflow-tf {command}: {path}: {e}") from e
    try:
        launch = LaunchResult.from_dict(data)
    except ValueError as e:
        raise SystemExit(f"airflow-tf {command}: launch result: {e}") from e
    if os.path.realpath(launch.run_dir) != os.path.realpath(args.run_dir):
        raise SystemExit(f"airflow-tf {command}: the launch result is of run directory {launch.run_dir}, "
                         f"not {args.run_dir}")
    return launch


def _serving_base(value: str | None) -> str:
    from airflow_tf.storage import models_dir

    return os.path.abspath(value or models_dir())


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate", help="evaluate a run's final checkpoint and decide whether it is blessed",
        description="Evaluate the final checkpoint of a run on its dataset's eval split, as the "
        "EvaluateModelOperator does: write metrics.json and training_curve.png into the run directory and "
        "print the evaluation result (metrics, blessed, reasons) as JSON. Exit status 0 whether blessed or "
        "not (see \"blessed\"); 2 when the options or the model are refused.",
    )
    _add_run_dir(p)
    p.add_argument("--thresholds", type=json_argument('an object of metric bounds, e.g. \'{"mse": {"max": 1.0}}\'', dict),
                   default=None, metavar="JSON|@FILE",
                   help='blessing thresholds, e.g. \'{"mse": {"max": 1.0}}\'')
    p.add_argument("--compare-to-served", action="store_true",
                   help="also require the model to be at least as good as the latest export of --model-name")
    p.add_argument("--model-name", default=None, help="the served model to compare with (--compare-to-served)")
    p.add_argument("--serving-base", default=None,
                   help="where exported models live (default <storage>/models, $AIRFLOW_TF_STORAGE)")
    p.add_argument("--comparison-metric", default=None,
                   help="the metric compared with the served model (default mse, or accuracy for classes)")
    p.set_defaults(func=_cmd_evaluate)


def _cmd_evaluate(args: argparse.Namespace, out: TextIO) -> int:
    from airflow_tf import serving
    from airflow_tf.serving import requests

    launch = _launch_of(args, "evaluate")
    if args.compare_to_served and not args.model_name:
        raise SystemExit("airflow-tf evaluate: --compare-to-served needs --model-name (the served model)")
    request = {"run_dir": launch.run_dir, "dataset": launch.dataset, "training": launch.training,
               "thresholds": args.thresholds, "compare_to_served": args.compare_to_served,
               "serving_base": _serving_base(args.serving_base) if args.compare_to_served else None,
               "model_name": args.model_name, "comparison_metric": args.comparison_metric}
    try:
        result = requests.evaluate(request)
    except (ValueError, serving.EvaluationError) as e:
        print(f"airflow-tf evaluate: refused: {_naming_flags(str(e), args)}", file=sys.stderr)
        return 2
    print("model " + ("BLESSED" if result["blessed"] else f"NOT blessed: {result['reasons']}"), file=sys.stderr)
    _print_json(result, out)
    return 0


NOT_EXPORTED = 3
"""Exit status of ``airflow-tf export`` when an unblessed model is skipped (``--on-unblessed skip``)."""


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="export a run's evaluated checkpoint as the next SavedModel version",
        description="Export the evaluated checkpoint of a run as <serving-base>/<model-name>/<version>/ "
        "(a SavedModel TensorFlow Serving loads), atomically, after checking its predictions, as the "
        "ExportSavedModelOperator does; print the export result as JSON. Only a blessed model is exported: "
        f"an unblessed one exits {NOT_EXPORTED} (--on-unblessed skip, the default) or 1 (fail), unless --force. "
        "Exit status 2 when the options or the model are refused.",
    )
    _add_run_dir(p)
    p.add_argument("--model-name", required=True, help="the served model's name, the directory under --serving-base")
    p.add_argument("--serving-base", default=None,
                   help="TensorFlow Serving's model base path (default <storage>/models, $AIRFLOW_TF_STORAGE)")
    p.add_argument("--metrics", type=json_argument("an evaluation result object (the output of airflow-tf evaluate)",
                                                   dict), default=None, metavar="JSON|@FILE",
                   help="the evaluation result (the output of `airflow-tf evaluate`; default the run's metrics.json)")
    p.add_argument("--force", action="store_true", help="export even an unblessed model")
    p.add_argument("--no-warmup-requests", dest="warmup_requests", action="store_false",
                   help="do not write assets.extra/tf_serving_warmup_requests (eval rows TensorFlow Serving "
                   "replays before serving the version)")
    p.add_argument("--on-unblessed", choices=["skip", "fail"], default="skip",
                   help=f"an unblessed model: skip (exit {NOT_EXPORTED}) or fail (exit 1)")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    from airflow_tf import serving
    from airflow_tf.cluster.results import EvaluationResult
    from airflow_tf.serving import requests

    launch = _launch_of(args, "export")
    metrics = None
    if args.metrics is not None:
        try:
            metrics = EvaluationResult.from_dict(args.metrics).to_dict()
        except ValueError as e:
            raise SystemExit(f"airflow-tf export: --metrics: {e}") from e
    request = {"run_dir": launch.run_dir, "dataset": launch.dataset, "training": launch.training,
               "serving_base": _serving_base(args.serving_base), "model_name": args.model_name,
               "metrics": metrics, "force": args.force, "warmup_requests": args.warmup_requests}
    try:
        result = requests.export(request)
    except serving.NotBlessedError as e:
        print(f"airflow-tf export: not exported: {e}", file=sys.stderr)
        return NOT_EXPORTED if args.on_unblessed == "skip" else 1
    except (ValueError, serving.ExportError) as e:
        print(f"airflow-tf export: refused: {_naming_flags(str(e), args)}", file=sys.stderr)
        return 2
    print(f"exported {result['model_name']} version {result['version']} to {result['path']}", file=sys.stderr)
    _print_json(result, out)
    return 0


# -- render -------------------------------------------------------------------------------
def _add_render(sub: argparse._SubParsersAction) -> None:
    from airflow_tf.backends.kubernetes.workloads import DEFAULT_WORKLOAD, WORKLOADS

    p = sub.add_parser(
        "render", help="print the Kubernetes manifests of a group (for kubectl apply -f -)",
        description="Print the Indexed Jobs (one per role), the headless Service and the NetworkPolicy "
        "(unless --no-network-policy) of a parameter-server/worker group as multi-document YAML, exactly as the "
        "Kubernetes backend creates them, the root Job first; the backend also sets ownerReferences "
        "from every other object to the root Job, which need its uid: "
        "airflow-tf render --name demo --ps 1 --workers 2 --image IMAGE | kubectl apply -f -. "
        "With --workload jobset: one JobSet (and the NetworkPolicy), the form a --queue-name needs. "
        "With --rbac --namespace N: instead, a team's namespace N (labelled for Pod Security Admission "
        "'restricted'), its service account airflow-tf, the backend's Role (airflow_tf/rbac/role.yaml) and "
        "their RoleBinding: airflow-tf render --rbac --namespace team-a | kubectl apply -f -.",
    )
    p.add_argument("--rbac", action="store_true",
                   help="print a team's namespace, service account, Role and RoleBinding (needs --namespace) "
                   "instead of a group")
    p.add_argument("--bind", action="append", default=[], metavar="NAMESPACE:SERVICEACCOUNT",
                   help="with --rbac: also bind the Role to this service account, e.g. the team's Airflow "
                   "workers' (repeatable)")
    p.add_argument("--name", help="group name (made a valid DNS-1123 label if it is not one); required without --rbac")
    add_group_arguments(p, "ps", "workers")
    p.add_argument("--image", help="training image (TensorFlow + the airflow_tf package); required without --rbac")
    p.add_argument("--namespace", default=None, help="namespace of every object (default: default; required "
                   "with --rbac)")
    add_training_arguments(p, dataset="/data", run_dir=None, steps=1000)
    add_group_arguments(p, "port")
    p.add_argument("--workload", choices=list(WORKLOADS), default=DEFAULT_WORKLOAD,
                   help="the group's form: " + "; ".join(f"{k}: {v}" for k, v in WORKLOADS.items()))
    p.add_argument("--network-policy", action=argparse.BooleanOptionalAction, default=True,
                   help="a NetworkPolicy through which the group's pods accept connections only from the group's "
                   "own pods (default: on; --no-network-policy leaves their gRPC servers open to any pod)")
    p.add_argument("--cluster-domain", default=None, help="append this cluster domain to the tasks' DNS names")
    p.add_argument("--data-claim", default=None, metavar="PVC",
                   help="PersistentVolumeClaim holding the datasets, mounted read-only at --data-mount")
    p.add_argument("--data-mount", default="/data", help="where --data-claim is mounted (default /data)")
    p.add_argument("--runs-claim", default=None, metavar="PVC",
                   help="PersistentVolumeClaim for checkpoints and event files, mounted at --runs-mount")
    p.add_argument("--runs-mount", default="/runs", help="where --runs-claim is mounted (default /runs)")
    p.add_argument("--worker-gpus", type=int, default=0, help="GPUs per worker (nvidia.com/gpu limit, >= 0)")
    for resource, example in (("cpu", "ps=500m"), ("memory", "worker=2Gi")):
        p.add_argument(f"--{resource}", action="append", default=[], type=_role_quantity(resource),
                       metavar="ROLE=QUANTITY",
                       help=f"{resource} request of each task of ROLE (ps, worker, chief, evaluator), e.g. {example}; "
                       "repeatable. Default: what a task of that role measured (docs/reference/kubernetes.md)")
    p.add_argument("--service-account", default=None, help="service account of the training pods")
    p.add_argument("--queue-name", default=None,
                   help="Kueue LocalQueue (needs --workload jobset): labels the JobSet and creates it suspended "
                   "for Kueue to admit the whole group")
    p.add_argument("--workload-priority-class", default=None,
                   help="Kueue WorkloadPriorityClass (needs --queue-name): labels the JobSet; a group of a higher "
                   "one preempts a running lower one")
    p.add_argument("--pod-template", default=None, metavar="FILE",
                   help="a Pod manifest (YAML) merged under what the backend sets")
    p.add_argument("--shm-size", default=None, help="memory-backed /dev/shm of this size, e.g. 1Gi")
    p.set_defaults(func=_cmd_render)


def _role_quantity(resource: str) -> Callable[[str], tuple[str, str]]:
    """``ROLE=QUANTITY`` of ``--cpu``/``--memory``: a role and a positive Kubernetes quantity."""
    from airflow_tf.cluster.memory import parse_quantity
    from airflow_tf.cluster.spec import ROLES

    example = "500m" if resource == "cpu" else "2Gi"

    def parse(text: str) -> tuple[str, str]:
        role, _, amount = text.partition("=")
        if role not in ROLES:
            raise argparse.ArgumentTypeError(f"{text!r}: expected ROLE=QUANTITY with ROLE one of {', '.join(ROLES)}, "
                                             f"e.g. worker={example}")
        try:
            parse_quantity(amount.strip(), repr(text), positive=True, example=f"{role}={example}")
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return role, amount.strip()
    return parse


def _role_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The per-role resources of ``--worker-gpus``, ``--cpu`` and ``--memory``."""
    options: dict[str, dict[str, Any]] = {}
    if args.worker_gpus:
        options["worker"] = {"resources": {"limits": {"nvidia.com/gpu": str(args.worker_gpus)}}}
    for resource in ("cpu", "memory"):
        for role, amount in getattr(args, resource):
            resources = options.setdefault(role, {}).setdefault("resources", {})
            resources.setdefault("requests", {})[resource] = amount
    return options


def _cmd_render(args: argparse.Namespace, out: TextIO) -> int:
    from airflow_tf.backends.kubernetes.manifests import to_yaml
    from airflow_tf.backends.kubernetes.render import render_workload
    from airflow_tf.cluster import GroupSpec, SpecError, TrainingConfig, dns1123_label

    if args.rbac:
        return _render_rbac(args, out)
    missing = [f"--{key}" for key in ("name", "image") if getattr(args, key) is None]
    if missing:
        sys.stderr.write(f"airflow-tf render: {' and '.join(missing)} required (a group's manifests), or --rbac\n")
        return 2
    name = dns1123_label(args.name, max_length=46)
    pod_defaults: dict[str, Any] = {}
    volumes = [{"claim": args.data_claim, "mount_path": args.data_mount, "read_only": True}] if args.data_claim else []
    volumes += [{"claim": args.runs_claim, "mount_path": args.runs_mount}] if args.runs_claim else []
    if volumes:
        pod_defaults["volumes"] = volumes
    for key in ("service_account", "queue_name", "workload_priority_class", "pod_template", "shm_size"):
        if getattr(args, key) is not None:
            pod_defaults[key] = getattr(args, key)
    if args.worker_gpus < 0:
        sys.stderr.write(f"airflow-tf render: --worker-gpus: {args.worker_gpus} is not a GPU count (>= 0)\n")
        return 2
    try:
        steps = None if args.epochs else args.steps  # --epochs replaces the default target step
        training = TrainingConfig.from_namespace(args, run_dir=args.run_dir or f"{args.runs_mount}/{name}", steps=steps)
        spec = GroupSpec.for_training(name, training, image=args.image, role_options=_role_options(args),
                                      **group_options_of(args, *RENDER_GROUP_OPTIONS))
        objects = render_workload(args.workload, spec, args.namespace or "default", cluster_domain=args.cluster_domain,
                                  network_policy=args.network_policy, pod_defaults=pod_defaults)
    except (SpecError, ValueError) as e:
        sys.stderr.write(f"airflow-tf render: {_naming_flags(str(e), args)}\n")
        return 2
    out.write(to_yaml(objects))
    return 0


def _render_rbac(args: argparse.Namespace, out: TextIO) -> int:
    from airflow_tf.backends.kubernetes.access import parse_subject, team_namespace
    from airflow_tf.backends.kubernetes.manifests import to_yaml
    from airflow_tf.cluster import SpecError

    if args.namespace is None:
        sys.stderr.write("airflow-tf render: --rbac needs --namespace (the team's namespace)\n")
        return 2
    try:
        objects = team_namespace(args.namespace, [parse_subject(text) for text in args.bind])
    except SpecError as e:
        sys.stderr.write(f"airflow-tf render: {_naming_flags(str(e), args)}\n")
        return 2
    out.write(to_yaml(objects))
    return 0


# -- demo ---------------------------------------------------------------------------------
def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="run the example DAG tf_linear_regression end to end and call the model it exported",
        description="Run the example DAG tf_linear_regression (prepare a dataset, train a parameter-server/"
        "worker group, evaluate, export a SavedModel) through `airflow dags test` in a self-contained Airflow "
        "home under --workdir (SQLite, local processes, local disk; nothing of your own Airflow settings), then "
        "call the exported model's serving signature as TensorFlow Serving would and print a JSON summary "
        "(model path and version, evaluation metrics, blessed, predictions). Takes a few minutes.",
    )
    p.add_argument("--workdir", required=True, help="directory for data, runs, models and AIRFLOW_HOME")
    p.add_argument("--dags-folder", default=None, help="the example DAGs (default: the repository's dags/)")
    p.add_argument("--kubernetes-plane", default=None, metavar="DIR",
                   help="train on the Kubernetes plane of `scripts/kube up DIR --nodes 1` instead of local processes")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    from airflow_tf.demo import REPO_DAGS, run_demo

    _print_json(run_demo(args.workdir, args.dags_folder or REPO_DAGS, plane=args.kubernetes_plane), out)
    return 0


SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_prepare, _add_run, _add_evaluate, _add_export, _add_render, _add_demo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="airflow-tf", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    args = parser.parse_args(argv)
    result = io.StringIO()
    with _stdout_to_stderr():
        status = int(args.func(args, result) or 0)
    sys.stdout.write(result.getvalue())
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
