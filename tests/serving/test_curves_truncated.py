"""The training curves of a run whose chief was killed mid-write (its node lost): the event file
ends in a truncated record, and the evaluation's curves keep every scalar before it instead of
failing the evaluation with TensorFlow's DATA_LOSS."""

from __future__ import annotations

from airflow_tf.serving.curves import read_scalars


def test_an_event_file_cut_mid_record_keeps_the_scalars_before_the_cut(tmp_path):
    import tensorflow as tf

    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for step in range(5):
            tf.summary.scalar("loss", float(step), step=step)
    writer.close()
    [events] = tmp_path.glob("events.out.tfevents.*")
    events.write_bytes(events.read_bytes()[:-7])  # the last record cut short, as a SIGKILL leaves it
    assert read_scalars(tmp_path) == {"loss": [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]}
