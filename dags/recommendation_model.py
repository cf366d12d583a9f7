"""The click-through model of the recommendation example: plain Keras, as a team writes it.

Each string id is hashed into a fixed number of buckets and looked up in an embedding table;
the two embeddings feed a small dense head that outputs the probability of a click. Nothing
here is specific to distributed training: the tasks split each table over the parameter
servers and look rows up where they live."""

import keras


def build(buckets: int = 524_288, dim: int = 16, hidden_units: int = 64):
    user = keras.Input((), dtype="string", name="user")
    item = keras.Input((), dtype="string", name="item")
    user_vector = keras.layers.Embedding(buckets, dim, name="user_embedding")(
        keras.layers.Hashing(buckets, name="user_bucket")(user))
    item_vector = keras.layers.Embedding(buckets, dim, name="item_embedding")(
        keras.layers.Hashing(buckets, name="item_bucket")(item))
    x = keras.layers.Concatenate()([user_vector, item_vector])
    x = keras.layers.Dense(hidden_units, activation="relu")(x)
    clicked = keras.layers.Dense(1, activation="sigmoid", name="click_probability")(x)
    return keras.Model({"user": user, "item": item}, clicked, name="click_model")
