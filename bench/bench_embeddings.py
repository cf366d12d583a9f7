"""Embedding tables on the parameter servers: a click model (two string ids -> ``Hashing`` ->
``Embedding(rows, dim)`` each -> a small dense head, Adagrad, 2 ps + 2 async workers on the
local backend), for tables of 1k, 1M and 4M rows, against baselines measured in the same run:

- **whole** (baseline): the same model with Keras's own lookup (the table read whole and gathered
  on the worker, the table whole on one ps): what the group did before;
- **tf-partitioned** (baseline, issue 37): the same model as a TensorFlow user writes it without
  airflow-tf (``tf_partitioned_click.py``): TF1 partitioned variables (``fixed_size_partitioner``
  over the ps, ``replica_device_setter``), ``tf.nn.embedding_lookup`` gathering on the ps,
  TensorFlow's Adagrad, one step per ``session.run`` of a ``MonitoredTrainingSession``; 2 ps + 2
  async workers as processes of their own, in a private network namespace like the local
  backend's groups;
- **ours**: the same model as users write it; airflow-tf slices each table over the ps tasks and
  looks the rows up there;
- **ours-1-step** (only when named in ``--only``): ours run as the baseline runs, one step per
  ``session.run`` and the input streamed from the files (ours defaults to several steps per call
  and the worker's share parsed once into memory): the ratio to tf-partitioned then compares the
  lookups and updates on the ps alone;
- **Keras fit** (1M table): the same model and optimizer in one process, ``model.fit`` on the
  same data.

The group contenders alternate ``--rounds`` times (their order turned each round), a checkpoint
written every 10 s in each. A run's rate is the median of its chief's progress windows (the
examples the global step moved by over each second) after start-up: from the third window on
(for tf-partitioned, the third after every worker has made its first step), for ``--seconds``.
Prints per run examples/s, the chief's last loss window and global step, each ps's peak resident
memory (VmHWM, checkpoint writes included) and its resident memory at the end, and bytes moved per
step (the loopback traffic of the group's private network namespace, both directions, divided by
the global steps); then per contender the median (min-max) over the rounds, its loss near the
global step every run reached, and the ratios, round by round. Goals: ours >= 0.9x
tf-partitioned; the 1M table at >= 0.7x the 1k table's examples/s; the largest ps of the 4M x 32
table at <= its share (tables and Adagrad slots / ps count) + 25 %; ahead of Keras fit on the 1M
table.

Usage: ``.venv/bin/python bench/bench_embeddings.py [--seconds 20] [--rounds 1] [--tables 1k,1m,4m]
[--only whole,tf-partitioned,ours,ours-1-step,fit] [--skip-baseline-4m] [--baseline-loss-on logits|probabilities]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.local.processes import KILL_WAIT, process_start_time, wait_gone
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.data import prepare_dataset, split_files
from airflow_tf.data.samples import write_clicks_csv

MODEL = '''
import keras


class KerasLookup(keras.layers.Embedding):
    """Keras's own lookup, kept as it is (a layer with its own call keeps Keras's path)."""

    def call(self, inputs):
        return super().call(inputs)


def build(rows, dim, whole_table=False):
    layer = KerasLookup if whole_table else keras.layers.Embedding
    user = keras.Input((), dtype="string", name="user")
    item = keras.Input((), dtype="string", name="item")
    u = layer(rows, dim)(keras.layers.Hashing(rows)(user))
    i = layer(rows, dim)(keras.layers.Hashing(rows)(item))
    x = keras.layers.Dense(32, activation="relu")(keras.layers.Concatenate()([u, i]))
    return keras.Model({"user": user, "item": item}, keras.layers.Dense(1, activation="sigmoid")(x))
'''

TABLES = {"1k": (1_024, 16), "1m": (1_048_576, 16), "4m": (4_194_304, 32)}
BATCH = 256
LEARNING_RATE = 0.05
CHECKPOINT_EVERY_SECS = TrainingConfig.checkpoint_every_secs
"""Checkpoints as users get them (every 10 s): a ps's peak is reached while one is written, so the
measured seconds (at least 15) hold at least one."""


def rss_mib(pid: int, field: str = "VmHWM") -> float:
    """The process's peak (``VmHWM``) or current (``VmRSS``) resident memory."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def loopback_bytes(pid: int) -> int:
    """Bytes received on the loopback of the process's network namespace (each byte sent there is received there)."""
    with open(f"/proc/{pid}/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[0])
    return 0


class SteadyRate:
    """A run's chief progress windows, by global step. The first ``SKIPPED`` span the start-up
    (graph registration, the other worker joining): the steady rate is the median of the rest."""

    SKIPPED = 3

    def __init__(self) -> None:
        self.reports: dict[int, dict] = {}

    def add(self, report: dict) -> bool:
        """Keep a report not seen before; True when it was new."""
        if report["global_step"] in self.reports:
            return False
        self.reports[report["global_step"]] = report
        return True

    @property
    def started(self) -> bool:
        return len(self.reports) >= self.SKIPPED

    def result(self) -> dict:
        ordered = [self.reports[step] for step in sorted(self.reports)]
        steady = ordered[self.SKIPPED:] or ordered
        return {"rate": statistics.median(r["examples_per_sec"] for r in steady), "loss": ordered[-1]["loss"],
                "global_step": ordered[-1]["global_step"],
                "losses": [(r["global_step"], r["loss"]) for r in ordered if r["loss"] is not None]}


def loss_near(result: dict, step: int) -> float:
    """The chief's mean loss over its three reports nearest to global step ``step``: runs of
    different speeds compared at the same step (a memorised id's loss falls epoch by epoch, so
    the faster run's last loss is lower)."""
    near = sorted(result["losses"], key=lambda report: abs(report[0] - step))[:3]
    return statistics.mean(loss for _, loss in near) if near else float("nan")


def watch(name: str, seconds: float, new_reports, problem, pids) -> dict:
    """Follow a running group: ``new_reports()`` gives the chief's progress reports seen since the
    last call, ``problem()`` why the group failed (or None), ``pids()`` its tasks' pids by name
    (``ps-0``, ...). Measures ``seconds`` after start-up, then reads the ps tasks' memory."""
    steady, traffic, started, deadline = SteadyRate(), [], time.monotonic(), None
    while deadline is None or time.monotonic() < deadline:
        failure = problem()
        if failure:
            raise RuntimeError(f"{name} failed: {failure}")
        for report in new_reports():
            if steady.add(report):
                ps0 = pids().get("ps-0")
                if ps0:
                    traffic.append((report["global_step"], loopback_bytes(ps0)))
                if deadline is None and steady.started:
                    deadline = time.monotonic() + seconds
        if deadline is None and time.monotonic() - started > 600:
            raise RuntimeError(f"{name}: no steady training after 600 s")
        time.sleep(0.2)
    ps = {task: pid for task, pid in sorted(pids().items()) if task.startswith("ps")}
    (s0, b0), (s1, b1) = traffic[2] if len(traffic) > 3 else traffic[0], traffic[-1]
    return {**steady.result(), "ps_peak_mib": {task: rss_mib(pid) for task, pid in ps.items()},
            "ps_rss_mib": {task: rss_mib(pid, "VmRSS") for task, pid in ps.items()},
            "bytes_per_step": (b1 - b0) / (s1 - s0) if s1 > s0 else float("nan")}


def train(backend: LocalBackend, dataset: str, run_dir: Path, rows: int, dim: int, whole_table: bool,
          seconds: float, **options) -> dict:
    """Ours (or, ``whole_table``, Keras's own lookup) on the local backend; ``options`` of TrainingConfig."""
    name = run_dir.name
    config = TrainingConfig(dataset=dataset, run_dir=str(run_dir), model="bench_click_model:build",
                            model_kwargs={"rows": rows, "dim": dim, "whole_table": whole_table},
                            loss="binary_crossentropy", optimizer="adagrad", learning_rate=LEARNING_RATE,
                            batch_size=BATCH, steps=10_000_000, log_every_secs=1.0,
                            checkpoint_every_secs=CHECKPOINT_EVERY_SECS, ps_memory_limit="64Gi", **options)
    ref = backend.launch(GroupSpec.for_training(name, config, ps=2, workers=2))
    latest: dict = {}

    def new_reports() -> list[dict]:
        latest["status"] = status = backend.status(ref)
        return [status.progress] if status.progress else []

    def problem() -> str | None:
        status = latest.get("status") or backend.status(ref)
        if status.failure or any(t.phase.value == "Failed" for t in status.tasks):
            return (f"{status.failure or [t.reason for t in status.tasks]}; "
                    f"see {backend.log_path(ref, 'worker', 0)}")
        return None

    try:
        return watch(name, seconds, new_reports, problem,
                     lambda: {task[len(name) + 1:]: pid for task, pid in backend.processes(ref).items()})
    finally:
        backend.teardown(ref)


def train_tf_partitioned(files: list[str], run_dir: Path, rows: int, dim: int, seconds: float,
                         loss_on: str = "logits") -> dict:
    """The baseline of ``tf_partitioned_click.py``: its launcher and its 2 ps + 2 workers, all
    stopped (and checked gone) before this returns."""
    run_dir.mkdir(parents=True)
    output = open(run_dir / "launcher.log", "wb")  # noqa: SIM115  closed in the finally below
    launcher = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("tf_partitioned_click.py")), "group", *files,
         "--rows", str(rows), "--dim", str(dim), "--batch", str(BATCH), "--learning-rate", str(LEARNING_RATE),
         "--checkpoint-secs", str(CHECKPOINT_EVERY_SECS), "--report-secs", "1", "--run-dir", str(run_dir),
         "--loss-on", loss_on],
        stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
        start_new_session=True)  # its own process group, which its tasks join: one killpg stops them all
    chief, others = run_dir / "progress-0.jsonl", [run_dir / "progress-1.jsonl"]
    read: dict = {"offset": 0}
    known: dict[str, tuple[int, int | None]] = {}

    def pids() -> dict[str, int]:
        if not known and (run_dir / "pids.json").exists():
            for task, pid in json.loads((run_dir / "pids.json").read_text()).items():
                known[task] = (pid, process_start_time(pid))
        return {task: pid for task, (pid, _) in known.items()}

    def new_reports() -> list[dict]:
        # The chief's windows before every worker has made its first step are start-up (a
        # worker that starts before the chief has initialised the variables waits 30 s, as
        # TensorFlow's WorkerSessionCreator polls): they are not counted.
        if "all_stepping" not in read:
            firsts = [path.read_text().split("\n", 1)[0] for path in others if path.exists()]
            if len(firsts) < len(others) or not all(first.endswith("}") for first in firsts):
                return []
            read["all_stepping"] = max(json.loads(first)["time"] for first in firsts)
        if not chief.exists():
            return []
        with open(chief, "rb") as f:
            f.seek(read["offset"])
            text = f.read()
        complete = text[:text.rfind(b"\n") + 1]
        read["offset"] += len(complete)
        reports = [json.loads(line) for line in complete.splitlines()]
        return [r for r in reports if r["time"] >= read["all_stepping"]]

    def problem() -> str | None:
        if launcher.poll() is None:
            return None
        return f"its launcher exited with {launcher.returncode}; see {run_dir}/*.log"

    try:
        pids()
        return watch(run_dir.name, seconds, new_reports, problem, pids)
    finally:
        pids()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGTERM)
        try:
            launcher.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        output.close()
        left = [f"{task} ({pid})" for task, (pid, start) in known.items() if not wait_gone([(pid, start)], KILL_WAIT)]
        if left:
            raise RuntimeError(f"{run_dir.name}: still running after the launcher was stopped: {', '.join(left)}")


KERAS_FIT = '''
import sys, time, json
import keras
sys.path.insert(0, sys.argv[1])
from bench_click_model import build
from airflow_tf.data import make_dataset
rows, dim, seconds, dataset = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
model = build(rows, dim)
model.compile(optimizer=keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
data = make_dataset(dataset, "train", %d, epochs=None, shuffle=True, seed=0)
times = []
class Clock(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        times.append(time.monotonic())
model.fit(data, steps_per_epoch=20, epochs=3, verbose=0, callbacks=[Clock()])  # warm-up
times.clear(); start = time.monotonic()
epochs = 0
while time.monotonic() - start < seconds:
    model.fit(data, steps_per_epoch=20, epochs=1, verbose=0)
    epochs += 1
print(json.dumps({"rate": epochs * 20 * %d / (time.monotonic() - start)}))
''' % (BATCH, BATCH)


def keras_fit(root: Path, dataset: str, rows: int, dim: int, seconds: float) -> float:
    import json

    out = subprocess.run([sys.executable, "-c", KERAS_FIT, str(root / "code"), str(rows), str(dim), str(seconds), dataset],
                         capture_output=True, text=True, check=False, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if out.returncode != 0:
        raise RuntimeError(f"keras fit failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["rate"]


CONTENDERS = ("whole", "tf-partitioned", "ours", "ours-1-step")
TITLES = {"whole": "whole table (baseline)", "tf-partitioned": "TF partitioned (baseline)", "ours": "on the ps (ours)",
          "ours-1-step": "ours, 1 step/run, streamed"}
OURS_1_STEP = {"steps_per_call": 1, "in_memory_input_bytes": 0}
"""ours-1-step: ours as the baseline runs, one step per ``session.run`` and the input streamed
from the files, so that the comparison isolates the lookups and updates on the ps."""
GOAL_VS_TF = 0.9
"""Issue 37: ours at >= 0.9x the examples/s of TensorFlow's own partitioned-variable path."""


KEPT_CHECKPOINTS = 5
"""Checkpoints a run keeps (TensorFlow's Saver default), while it writes the next one."""


def run_contender(name: str, backend: LocalBackend, dataset: str, files: list[str], run_dir: Path, rows: int,
                  dim: int, seconds: float, baseline_loss_on: str = "logits") -> dict:
    try:
        if name == "tf-partitioned":
            return train_tf_partitioned(files, run_dir, rows, dim, seconds, baseline_loss_on)
        return train(backend, dataset, run_dir, rows, dim, name == "whole", seconds,
                     **(OURS_1_STEP if name == "ours-1-step" else {}))
    finally:
        # The 4M tables' checkpoints are 2 GiB each: the bench needs none once a run is over.
        for path in [*run_dir.glob("model.ckpt-*"), *run_dir.glob("*_temp")]:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def disk_short_of(root: Path, rows: int, dim: int) -> str | None:
    """Why ``root``'s disk cannot hold a run's checkpoints of these tables (two tables and their
    Adagrad accumulators each), or None."""
    needed = (KEPT_CHECKPOINTS + 1) * 2 * 2 * rows * dim * 4
    free = shutil.disk_usage(root).free
    if free >= needed:
        return None
    return f"its checkpoints need {needed / 2**30:.1f} GiB and {root} has {free / 2**30:.1f} GiB free (--workdir)"


def print_run(label: str, dim: int, round_: int, name: str, result: dict) -> None:
    peaks = ", ".join(f"{task} {mib:,.0f} MiB (now {result['ps_rss_mib'][task]:,.0f})"
                      for task, mib in result["ps_peak_mib"].items())
    print(f"{label:>3} rows x {dim:>2} round {round_ + 1} {TITLES[name]:26s}: {result['rate']:9,.0f} examples/s  "
          f"loss {result['loss']:.4f} at step {result['global_step']:,}  peak RSS {peaks}  "
          f"{result['bytes_per_step'] / 2**20:9.3f} MiB moved/step", flush=True)


def print_table_summary(label: str, runs: dict[str, list[dict]]) -> None:
    """Per contender the median (min-max) over the rounds; ours over each baseline, by the medians
    and round by round (a round's runs are minutes apart: their ratio suffers less from the
    machine's other load than rates taken across rounds)."""
    common = min(r["global_step"] for results in runs.values() for r in results)
    for name, results in runs.items():
        rates = [r["rate"] for r in results]
        losses = [loss_near(r, common) for r in results]
        print(f"{label:>3} {TITLES[name]:26s} median {statistics.median(rates):9,.0f} ({min(rates):,.0f}-"
              f"{max(rates):,.0f}) examples/s over {len(rates)} round(s); loss near step {common:,} "
              f"{min(losses):.4f}-{max(losses):.4f}; "
              f"{statistics.median(r['bytes_per_step'] for r in results) / 2**20:.3f} MiB moved/step", flush=True)
    for ours_name, baseline in (("ours", "whole"), ("ours", "tf-partitioned"), ("ours-1-step", "tf-partitioned")):
        if baseline not in runs or ours_name not in runs:
            continue
        ours = [r["rate"] for r in runs[ours_name]]
        theirs = [r["rate"] for r in runs[baseline]]
        per_round = [o / t for o, t in zip(ours, theirs, strict=False)]
        goal = ""
        if (ours_name, baseline) == ("ours", "tf-partitioned"):
            met = statistics.median(ours) / statistics.median(theirs) >= GOAL_VS_TF
            goal = f" (goal >= {GOAL_VS_TF}x: {'met' if met else 'MISSED'})"
        print(f"{label:>3}: {ours_name} / {baseline} {statistics.median(ours) / statistics.median(theirs):.2f}x examples/s"
              f"{goal}; per round {', '.join(f'{r:.2f}' for r in per_round)}x", flush=True)


def print_goals(results: dict[str, dict[str, list[dict]]]) -> None:
    ours = {label: runs["ours"] for label, runs in results.items() if "ours" in runs}
    if "1k" in ours and "1m" in ours:
        ratio = statistics.median(r["rate"] for r in ours["1m"]) / statistics.median(r["rate"] for r in ours["1k"])
        print(f"ours: 1M table / 1k table {ratio:.2f}x examples/s (goal >= 0.7x: {'met' if ratio >= 0.7 else 'MISSED'})")
    if "4m" in ours:
        rows, dim = TABLES["4m"]
        share = 2 * rows * dim * 4 * 2 / 2 / 2**20  # two tables + their Adagrad accumulators, over 2 ps
        largest = max(max(r["ps_peak_mib"].values()) for r in ours["4m"])
        steady = max(max(r["ps_rss_mib"].values()) for r in ours["4m"])
        if "1k" not in ours:
            print(f"ours 4M x 32: largest ps peak {largest:,.0f} MiB, while training {steady:,.0f} MiB; share "
                  f"{share:,.0f} MiB (the goal needs the 1k table's ps as the base: run with --tables 1k,4m)")
        else:
            base = max(max(r["ps_peak_mib"].values()) for r in ours["1k"])
            goal = base + share * 1.25
            print(f"ours 4M x 32: largest ps peak {largest:,.0f} MiB, while training {steady:,.0f} MiB; share "
                  f"{share:,.0f} MiB over a 1k-table ps of {base:,.0f} MiB; goal <= {goal:,.0f} MiB: peak "
                  f"{'met' if largest <= goal else 'MISSED'}, while training {'met' if steady <= goal else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="steady-state seconds per run (at least 15, so that a checkpoint is written in them)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each group contender, alternated")
    parser.add_argument("--tables", default="1k,1m,4m", help="tables to run, of " + ",".join(TABLES))
    parser.add_argument("--only", default="whole,tf-partitioned,ours,fit",
                        help="contenders to run, of " + ",".join((*CONTENDERS, "fit")) + " (fit: Keras fit, 1M only)")
    parser.add_argument("--baseline-loss-on", choices=("logits", "probabilities"), default="logits",
                        help="the tf-partitioned baseline's loss: on its logit (as a TensorFlow user writes it), "
                             "or on the sigmoid's probability through Keras's binary_crossentropy, as ours")
    parser.add_argument("--skip-baseline-4m", action="store_true",
                        help="skip the whole-table baseline of the 4M table (minutes for a few steps)")
    args = parser.parse_args()
    if args.seconds < 15:
        parser.error("--seconds must be at least 15: the peak memory is reached while a checkpoint is written")
    only = args.only.split(",")
    if unknown := set(only) - {*CONTENDERS, "fit"}:
        parser.error(f"--only: unknown contender(s) {', '.join(sorted(unknown))}")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench-embeddings-"))
    (root / "code").mkdir(parents=True, exist_ok=True)
    (root / "code" / "bench_click_model.py").write_text(MODEL)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root / "code"), os.environ.get("PYTHONPATH")) if p)
    backend = LocalBackend(root / "groups")
    print(f"workdir {root}; {os.cpu_count()} CPU(s); load average {os.getloadavg()[0]:.1f} "
          "(figures are only meaningful on an otherwise idle machine)", flush=True)
    csv = write_clicks_csv(root / "clicks.csv", rows=200_000, users=5_000_000, items=5_000_000, seed=0)
    dataset = prepare_dataset(csv, root / "datasets", name="clicks", label="clicked", shards=4,
                              string_columns=["user", "item"])["dataset_uri"]
    files = split_files(dataset, "train")
    results: dict[str, dict[str, list[dict]]] = {}
    for label in args.tables.split(","):
        rows, dim = TABLES[label]
        if short := disk_short_of(root, rows, dim):
            print(f"{label:>3}: skipped: {short}", flush=True)
            continue
        names = [n for n in CONTENDERS if n in only and not (n == "whole" and label == "4m" and args.skip_baseline_4m)]
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            turn = round_ % max(1, len(names))  # each round starts with another contender
            for name in names[turn:] + names[:turn]:
                run_dir = root / f"emb-{label}-{name}-{round_}"
                runs[name].append(run_contender(name, backend, dataset, files, run_dir, rows, dim, args.seconds,
                                                args.baseline_loss_on))
                print_run(label, dim, round_, name, runs[name][-1])
        results[label] = runs
        print_table_summary(label, runs)
        if label == "1m" and "fit" in only:
            fit = keras_fit(root, dataset, rows, dim, args.seconds)
            line = f" 1m Keras fit (1 process, Adagrad): {fit:9,.0f} examples/s"
            if runs.get("ours"):
                ours = statistics.median(r["rate"] for r in runs["ours"])
                line += f"; ours / fit {ours / fit:.2f}x  (goal > 1: {'met' if ours > fit else 'MISSED'})"
            print(line, flush=True)
    print_goals(results)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
