"""TFRecord preparation and reading: schema, conversion, atomic commit, tf.data input."""
