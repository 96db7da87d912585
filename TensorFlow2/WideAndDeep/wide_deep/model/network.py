"""The Wide & Deep model (reference A.2) as a tf-keras ``Model`` with two parts trained by two optimizers.

Inputs (a dict, as :mod:`wide_deep.data.loader` yields): one-hot ids ``[B]`` int32, multi-hot ids
``[B, max_hotness]`` int32 padded with -1, numericals ``[B]`` float32. Output: logits ``[B]`` float32
(``sigmoid(wide + deep)`` is the click probability; the loss uses the logits).

- wide (``model.wide``, FTRL): a linear model: one weight per id of every categorical (multi-hot ids summed),
  a weight per numerical, a bias;
- deep (``model.deep``, RMSprop): an embedding per categorical (width from ``embedding_sizes.json``), multi-hot
  pooled with ``combiner`` (``sum`` or ``mean`` of the valid ids), concatenated with the numericals, then
  ``hidden_units`` ReLU layers with dropout and a final linear unit.

Embedding lookups are gathers, so their gradients are ``IndexedSlices`` (sparse optimizer updates, sparse
Horovod allreduce as allgather).

The MovieLens example's network is the deep part alone (:class:`DeepOnlyModel`). What the model needs to know
(``ModelConfig``, the embedding widths) is :mod:`wide_deep.model.config`, which imports no TensorFlow.
"""
from __future__ import annotations

from typing import Dict

import tensorflow as tf
from recsys_common.feature_spec import FeatureSpec

from .config import ModelConfig, wide_deep_config


def configure_precision(amp: bool, cpu: bool) -> None:
    """Sets the Keras policy: ``mixed_bfloat16`` on CPU, ``mixed_float16`` on GPU (with loss scaling)."""
    if amp:
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16" if cpu else "mixed_float16")
    else:
        tf.keras.mixed_precision.set_global_policy("float32")


def _pool(table: tf.Variable, ids: tf.Tensor, combiner: str, dtype) -> tf.Tensor:
    """Gather rows of ``table`` for ``ids`` ``[B]`` or ``[B, H]`` (-1 = padding) and pool over H."""
    if ids.shape.rank == 1:
        return tf.cast(tf.gather(table, ids), dtype)
    mask = tf.cast(ids >= 0, dtype)
    rows = tf.cast(tf.gather(table, tf.maximum(ids, 0)), dtype) * mask[:, :, None]
    pooled = tf.reduce_sum(rows, axis=1)
    if combiner == "mean":
        pooled = pooled / tf.maximum(tf.reduce_sum(mask, axis=1, keepdims=True), 1.0)
    return pooled


class WidePart(tf.keras.layers.Layer):
    """Linear model; kept in float32 whatever the mixed-precision policy (it is cheap and FTRL wants it)."""

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.config = config
        self.tables = {name: self.add_weight(name=f"wide_{name}", shape=(card, 1), initializer="zeros")
                       for name, card in config.categorical.items()}
        self.numerical_weights = self.add_weight(name="wide_numerical", shape=(max(len(config.numerical), 1), 1),
                                                 initializer="zeros")
        self.bias = self.add_weight(name="wide_bias", shape=(1,), initializer="zeros")

    def call(self, inputs):
        out = self.bias
        for name, table in self.tables.items():
            out = out + _pool(table, inputs[name], "sum", tf.float32)
        if self.config.numerical:
            numerical = tf.stack([tf.cast(inputs[n], tf.float32) for n in self.config.numerical], axis=1)
            out = out + tf.matmul(numerical, self.numerical_weights[:len(self.config.numerical)])
        return out[:, 0]


class Dropout16(tf.keras.layers.Layer):
    """Inverted dropout whose mask comes from 16-bit random numbers, two per Philox draw.

    Training: :math:`y = x \\cdot m / (1 - r')` with :math:`m = [u \\ge t]`, :math:`u` uniform on
    :math:`\\{0, \\dots, 2^{16} - 1\\}` per element, :math:`t = \\mathrm{round}(r \\cdot 2^{16})` and
    :math:`r' = t / 2^{16}` (``rate`` 0.1 drops with probability 0.1000061); inference: ``y = x``.

    Why not ``tf.keras.layers.Dropout``: it draws one Philox float per element (TF's ``RandomUniform``), which took
    15 % of a bfloat16 training step of the 5 x 1024 deep part on a 2-core AMD EPYC (profile of 2026-11-25); one
    32-bit ``uniform_full_int`` draw split into two 16-bit numbers does half the generator's work and compares
    integers.

    The stream: Philox keyed by ``seed`` (each layer its own key, so the layers' masks are independent; a
    generator *seeded* with consecutive seeds would start at consecutive counters of one key, and one layer's
    numbers would be the next layer's shifted by one block), counter ``[0, stream]``: ``set_stream(rank)`` gives
    every Horovod rank its own, disjoint sequence (rank 0's is the single-process one). The generator is not a
    weight of the layer (exports and the model's variables stay as they were); the training checkpoint saves its
    state (``generator``, see ``wide_deep.checkpointing.Checkpointer``), so a resumed run draws the masks the
    uninterrupted run would have.

    Args:
        rate: fraction of the units to drop, in ``[0, 1)``.
        seed: the Philox key of this layer's masks.
    """

    def __init__(self, rate: float, seed: int, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
        self.rate = float(rate)
        self.threshold = int(round(self.rate * 65536))
        self.seed = int(seed)
        with tf.init_scope():   # a variable created eagerly, even when the layer is built inside a tf.function
            generator = tf.random.Generator.from_key_counter(key=self.seed, counter=[0, 0], alg="philox")
        object.__setattr__(self, "_generator", generator)   # not tracked: not a weight, not exported

    @property
    def generator(self) -> tf.random.Generator:
        """The mask stream (Philox state ``[counter_low, counter_high, key]``)."""
        return self._generator

    def set_stream(self, stream: int) -> None:
        """Draw from counter block ``stream`` (the high counter word; a Horovod rank), keeping the position reached
        in it (the low word), e.g. after restoring rank 0's checkpointed state."""
        position = int(self._generator.state[0].numpy())
        self._generator.reset(tf.constant([position, int(stream), self.seed], tf.int64))

    def _random_uint16(self, inputs):
        """``uint16`` random numbers of ``inputs``' shape."""
        shape = tf.shape(inputs)
        last = inputs.shape[-1]
        if last is not None and last % 2 == 0:   # [..., D] from [..., D / 2] words: no copy
            half = tf.concat([shape[:-1], [last // 2]], axis=0)
            words = self._generator.uniform_full_int(half, dtype=tf.uint32)
            return tf.reshape(tf.bitcast(words, tf.uint16), shape)
        size = tf.size(inputs)
        words = self._generator.uniform_full_int(tf.reshape((size + 1) // 2, [1]), dtype=tf.uint32)
        return tf.reshape(tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:size], shape)

    def call(self, inputs, training=False):
        if not training or self.threshold == 0:
            return inputs
        keep = self._random_uint16(inputs) >= tf.constant(self.threshold, tf.uint16)
        scale = tf.cast(1.0 / (1.0 - self.threshold / 65536.0), inputs.dtype)
        # One select of two scalars and one product (its gradient is the same product): fewer passes over the
        # activations than selecting between the scaled input and zeros, forward and backward (A/B in one process,
        # bf16 step of the benchmark's model, 2026-11-25, AMD EPYC: 1.01x, 7 of 8 rounds faster).
        mask = tf.stop_gradient(tf.where(keep, scale, tf.zeros([], inputs.dtype)))
        return inputs * mask

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


class DeepPart(tf.keras.layers.Layer):
    """Embeddings + numericals -> MLP -> one logit."""

    def __init__(self, config: ModelConfig, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.tables = {}
        for i, (name, card) in enumerate(config.categorical.items()):
            dim = config.embedding_dims[name]
            # NVIDIA's embedding_column default: truncated normal with stddev 1/sqrt(dim)
            init = tf.keras.initializers.TruncatedNormal(stddev=1.0 / dim ** 0.5, seed=seed + i)
            self.tables[name] = self.add_weight(name=f"embedding_{name}", shape=(card, dim), initializer=init,
                                                dtype="float32")
        self.hidden = [tf.keras.layers.Dense(units, activation="relu", name=f"hidden_{i}",
                                             kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 100 + i))
                       for i, units in enumerate(config.hidden_units)]
        self.dropouts = [Dropout16(config.dropout, seed=seed + 200 + i, name=f"dropout_{i}")
                         for i in range(len(config.hidden_units))]
        self.head = tf.keras.layers.Dense(1, name="deep_logit",
                                          kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 300))

    def dropout_generators(self) -> Dict[str, tf.random.Generator]:
        """``{"dropout_<i>": generator}`` of the hidden layers' masks (what the training checkpoint saves)."""
        return {layer.name: layer.generator for layer in self.dropouts}

    def set_dropout_stream(self, stream: int) -> None:
        """Every mask stream to counter block ``stream`` (``Dropout16.set_stream``; the Horovod rank)."""
        for layer in self.dropouts:
            layer.set_stream(stream)

    def call(self, inputs, training=False):
        dtype = self.compute_dtype
        parts = [_pool(table, inputs[name], self.config.combiner, dtype) for name, table in self.tables.items()]
        parts += [tf.cast(inputs[n], dtype)[:, None] for n in self.config.numerical]
        x = tf.concat(parts, axis=1)
        for dense, dropout in zip(self.hidden, self.dropouts):
            x = dropout(dense(x), training=training)
        return tf.cast(self.head(x), tf.float32)[:, 0]


class WideDeepModel(tf.keras.Model):
    """``model(inputs, training)`` -> logits ``[B]`` float32; ``model.wide`` / ``model.deep`` own their variables."""

    def __init__(self, config: ModelConfig, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.wide = WidePart(config, name="wide")
        self.deep = DeepPart(config, seed=seed, name="deep")

    def call(self, inputs, training=False):
        return self.wide(inputs) + self.deep(inputs, training=training)

    def build_from_config(self, batch_size: int = 2) -> "WideDeepModel":
        """Create all variables by calling the model once on a dummy batch; returns self."""
        self(dummy_batch(self.config, batch_size), training=False)
        return self


class DeepOnlyModel(tf.keras.Model):
    """The MovieLens example's network (the HugeCTR notebook's): the recipe's :class:`DeepPart` alone.

    ``model(inputs)`` -> logits ``[B]``; ``model.deep`` is the ``DeepPart`` (the checkpoint keys ``model/deep/...``).
    """

    def __init__(self, config: ModelConfig, seed: int = 0, **kwargs):
        super().__init__(name="movielens_deep", **kwargs)
        self.deep = DeepPart(config, seed=seed, name="deep")

    def call(self, inputs, training=False):
        return self.deep(inputs, training=training)

    def build_from_config(self, batch_size: int = 2) -> "DeepOnlyModel":
        """Create all variables by calling the model once on a dummy batch; returns self."""
        self(dummy_batch(self.deep.config, batch_size))
        return self


def dummy_batch(config: ModelConfig, batch_size: int) -> Dict[str, tf.Tensor]:
    """Inputs of ``batch_size`` rows for ``config`` (id 0, multi-hot lists empty, numericals 0)."""
    dummy = {name: tf.zeros([batch_size], tf.int32) for name in config.onehot}
    dummy.update({name: -tf.ones([batch_size, config.max_hotness[name]], tf.int32) for name in config.multihot})
    dummy.update({name: tf.zeros([batch_size], tf.float32) for name in config.numerical})
    return dummy


def build_model(spec: FeatureSpec, embedding_sizes_file: str, hidden_units, dropout: float, combiner: str,
                seed: int) -> WideDeepModel:
    """``main.py``'s Wide & Deep for the feature spec (:func:`wide_deep.model.config.wide_deep_config`), its
    variables built."""
    config = wide_deep_config(spec, embedding_sizes_file, hidden_units, dropout, combiner)
    return WideDeepModel(config, seed=seed).build_from_config()


def build_movielens_model(config: ModelConfig, seed: int) -> DeepOnlyModel:
    """The MovieLens example's network (:func:`wide_deep.model.config.movielens_config`), its variables built."""
    return DeepOnlyModel(config, seed=seed).build_from_config()
