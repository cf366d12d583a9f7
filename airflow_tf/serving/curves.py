"""The training curve of a run, read from its TensorBoard event files and drawn as a PNG
(loss, and examples/s when the run logged it, over the global step) with the eval metrics
in the title, for people who would rather look than read metrics.json."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any
from collections.abc import Iterator, Mapping

from airflow_tf.files import atomic_write_bytes

EVENT_FILE_GLOB = "events.out.tfevents.*"
LOSS_TAG = "loss"
THROUGHPUT_TAGS = ("examples_per_sec", "examples/sec", "global_step/sec")


def read_scalars(run_dir: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the run's event files, ``{tag: [(step, value), ...]}`` sorted by step.

    A run restarted from a checkpoint writes a new event file and repeats some steps; the
    value written last wins. A file whose writer was killed mid-record (its node lost, say) ends
    in a truncated record: the records before it are kept, as TensorBoard keeps them."""
    import tensorflow as tf

    files = sorted(Path(run_dir).rglob(EVENT_FILE_GLOB), key=lambda p: p.stat().st_mtime)
    latest: dict[str, dict[int, tuple[float, float]]] = {}
    for path in files:
        for event in _events(tf, path):
            for value in event.summary.value:
                number = _scalar(value, tf)
                if number is None:
                    continue
                seen = latest.setdefault(value.tag, {})
                previous = seen.get(event.step)
                if previous is None or event.wall_time >= previous[0]:
                    seen[event.step] = (event.wall_time, number)
    return {tag: sorted((step, v) for step, (_, v) in steps.items()) for tag, steps in latest.items()}


def _events(tf: Any, path: Path) -> Iterator[Any]:
    """The events of one file, up to a truncated last record."""
    try:
        for record in tf.data.TFRecordDataset(str(path), buffer_size=1 << 16):
            yield tf.compat.v1.Event.FromString(record.numpy())
    except tf.errors.DataLossError:
        return


def _scalar(value: Any, tf: Any) -> float | None:
    """TF1 summaries store ``simple_value``; TF2 ``tf.summary.scalar`` stores a scalar tensor."""
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor" and value.metadata.plugin_data.plugin_name == "scalars":
        array = tf.make_ndarray(value.tensor)
        return float(array) if array.size == 1 else None
    return None


def _find(scalars: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    """The tag named ``name`` or ending in ``/name`` (summaries may sit under a scope)."""
    for name in names:
        for tag in sorted(scalars):
            if tag == name or tag.endswith("/" + name):
                return tag
    return None


def plot_training_curve(run_dir: str | os.PathLike[str], output: str | os.PathLike[str],
                        metrics: Mapping[str, float] | None = None, title: str | None = None) -> Path | None:
    """Write the PNG; returns its path, or None when the run has no loss in its event files."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    scalars = read_scalars(run_dir)
    loss_tag = _find(scalars, (LOSS_TAG,))
    if loss_tag is None:
        return None
    throughput_tag = _find(scalars, THROUGHPUT_TAGS)

    rows = 2 if throughput_tag else 1
    figure = Figure(figsize=(8, 3.2 * rows + 0.6), layout="constrained")
    axes = figure.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]

    steps, values = zip(*scalars[loss_tag], strict=True)
    axes[0].plot(steps, values, color="tab:blue", label=f"training {loss_tag}")
    finite = [v for v in values if math.isfinite(v) and v > 0]
    if finite and max(finite) / min(finite) > 100:  # a loss falling over decades reads better on a log scale
        axes[0].set_yscale("log")
    if metrics and metrics.get("loss") is not None and math.isfinite(metrics["loss"]):
        axes[0].axhline(metrics["loss"], color="tab:red", linestyle="--", label=f"eval loss {metrics['loss']:.4g}")
    axes[0].set_ylabel("loss")
    axes[0].grid(True, alpha=0.3)
    axes[0].legend(loc="upper right")

    if throughput_tag:
        t_steps, t_values = zip(*scalars[throughput_tag], strict=True)
        axes[1].plot(t_steps, t_values, color="tab:green")
        axes[1].set_ylabel(throughput_tag.replace("_", " "))
        axes[1].grid(True, alpha=0.3)
    axes[-1].set_xlabel("global step")

    summary = ", ".join(f"{k}={v:.4g}" for k, v in (metrics or {}).items() if isinstance(v, (int, float)))
    figure.suptitle("\n".join(part for part in (title, f"eval: {summary}" if summary else "") if part))

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return atomic_write_bytes(output, buffer.getvalue())
