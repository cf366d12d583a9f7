"""The mounted TensorBoard reads each event file it opened, not the path checked at request time.

TensorBoard (the mount's build, in this process, reloading in its background thread) serves
alice's run tf-a and bob's run tf-b; each request sees the runs its user may read. After
alice's request was answered, a file appears in tf-a that is a symbolic link or a hard link
to tf-b's events, stays while TensorBoard reloads, and is removed before her next request
(which the request-time check then passes): her run never shows tf-b's curve.

The loader itself, on real files, is quick; the whole TensorBoard (which imports TensorFlow
when present, and reloads on its clock) is slow. Event files are written by TensorBoard's own
record writer (the format the training tasks write)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from airflow_tf.plugins import tensorboard
from airflow_tf.plugins.access import Access
from airflow_tf.plugins.run_files import CheckedEventFileLoader

pytest.importorskip("tensorboard")

from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.summary.writer.record_writer import RecordWriter  # noqa: E402
from werkzeug.test import Client  # noqa: E402

RELOAD_SECS = 0.3
OWNERS = {"tf-a": {"team_a"}, "tf-b": {"team_b"}}


def write_events(run: Path, name: str, losses: list[float]) -> Path:
    """An event file ``name`` in ``run`` with one ``loss`` value per step, as TensorBoard's writer
    writes it (its record writer; its event file writer would import TensorFlow here)."""
    run.mkdir(parents=True, exist_ok=True)
    with open(run / name, "wb") as handle:
        writer = RecordWriter(handle)
        writer.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        for step, loss in enumerate(losses):
            value = summary_pb2.Summary.Value(tag="loss", simple_value=loss)
            event = event_pb2.Event(step=step, wall_time=time.time(), summary=summary_pb2.Summary(value=[value]))
            writer.write(event.SerializeToString())
    return run / name


def losses(app, user: Access, run: str) -> list[float] | None:
    """The ``loss`` curve of ``run`` as ``user`` gets it from TensorBoard; None when not found."""
    token = tensorboard.READABLE.set(user)
    try:
        response = Client(app).get(f"/data/plugin/scalars/scalars?run={run}&tag=loss")
    finally:
        tensorboard.READABLE.reset(token)
    if response.status_code != 200:
        return None
    return [round(value, 3) for _, _, value in json.loads(response.get_data())]


def loaded(loader: CheckedEventFileLoader) -> list[tuple[int, float]]:
    """(step, loss) of the events the loader yields now."""
    return [(event.step, round(value.tensor.float_val[0], 3)) for event in loader.Load()
            for value in event.summary.value if value.tag == "loss"]


def test_the_loader_reads_the_file_it_opened_and_refuses_links_and_hard_links(tmp_path, caplog):
    runs = tmp_path / "runs"
    mine = write_events(runs / "tf-a", "events.out.tfevents.1.a", [1.0, 2.0])
    theirs = write_events(runs / "tf-b", "events.out.tfevents.1.b", [1000.0])
    (runs / "tf-a" / "events.out.tfevents.2.a").symlink_to(theirs)
    (runs / "tf-a" / "sub").symlink_to(runs / "tf-b")
    os.link(theirs, runs / "tf-a" / "events.out.tfevents.3.a")
    with caplog.at_level("WARNING"):
        for relative in ("tf-a/events.out.tfevents.2.a", "tf-a/sub/events.out.tfevents.1.b",
                         "tf-a/events.out.tfevents.3.a"):
            refused = CheckedEventFileLoader(str(runs), relative)
            assert loaded(refused) == [] and loaded(refused) == []
    assert caplog.text.count("TensorBoard does not read") == 3  # each logged once
    loader = CheckedEventFileLoader(str(runs), "tf-a/events.out.tfevents.1.a")
    with open(mine, "ab") as writer:  # the training task's writer keeps its file open
        assert loaded(loader) == [(0, 1.0), (1, 2.0)]
        mine.unlink()
        mine.symlink_to(theirs)  # swapped for a link to their events after it was opened
        more = write_events(tmp_path / "scratch", "events", [3.0]).read_bytes()
        writer.write(more[:10])
        writer.flush()
        assert loaded(loader) == []  # a record being written is read once it is whole
        writer.write(more[10:])
    assert loaded(loader) == [(0, 3.0)]  # her file's new record, nothing of theirs
    loader.close()


@pytest.mark.slow
@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_an_event_file_linked_to_another_run_after_the_check_never_shows_that_run(tmp_path, monkeypatch, link):
    runs = tmp_path / "runs"
    write_events(runs / "tf-a", "events.out.tfevents.100.a", [1.0, 2.0])
    theirs = write_events(runs / "tf-b", "events.out.tfevents.100.b", [1000.0, 1001.0, 1002.0])
    alice = Access(frozenset({"team_a"}), every_dag=False, owners=OWNERS, roots={"": str(runs)})
    bob = Access(frozenset({"team_b"}), every_dag=False, owners=OWNERS, roots={"": str(runs)})
    monkeypatch.setattr(tensorboard, "RELOAD_INTERVAL_SECS", RELOAD_SECS)
    app = tensorboard.build_tensorboard({"": str(runs)})

    deadline = time.monotonic() + 60
    while losses(app, alice, "tf-a") != [1.0, 2.0] or losses(app, bob, "tf-b") is None:
        assert time.monotonic() < deadline, "TensorBoard did not load the runs"
        time.sleep(RELOAD_SECS)
    assert losses(app, alice, "tf-b") is None  # hers only, as checked at each request

    planted = runs / "tf-a" / "events.out.tfevents.200.a"  # after hers: the one TensorBoard reads next
    if link == "symlink":
        planted.symlink_to(theirs)
    else:
        os.link(theirs, planted)
    time.sleep(5 * RELOAD_SECS)  # TensorBoard reloads, in its own thread, while the link is there
    planted.unlink()  # gone before her next request: a check of the run's files now finds nothing
    time.sleep(3 * RELOAD_SECS)

    assert losses(app, alice, "tf-a") == [1.0, 2.0]
    assert losses(app, bob, "tf-b") == [1000.0, 1001.0, 1002.0]  # and bob's run is his as before
