"""Multi-layer perceptron of DLRM/DCNv2 (bottom and top MLP).

``MLP(dims, activate_last)`` is a stack of ``tf.keras.layers.Dense``: for layer ``i`` with ``dims[i]`` units

    h_{i+1} = relu(h_i W_i + b_i)            (the last layer has no ReLU unless ``activate_last``)

Initialisation as NVIDIA's TF2 recipe (``nn/dense_model.py`` of DLRM_and_DCNv2): kernels ``GlorotNormal``
(truncated normal, stddev sqrt(2 / (fan_in + fan_out))), biases ``Normal(0, sqrt(1 / units))``.
The bottom MLP ends with a ReLU (``activate_last=True``), the top MLP with a linear layer producing the logit.

Example::

    mlp = MLP([512, 256, 64], activate_last=True)
    y = mlp(tf.zeros([8, 16]))            # [8, 64]

The layers follow the global Keras mixed-precision policy (float32 variables, bfloat16/float16 compute under AMP).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import tensorflow as tf


def dense_layer(units: int, activation: Optional[str], seed: Optional[int] = None,
                name: Optional[str] = None) -> tf.keras.layers.Dense:
    """One Dense layer initialised as NVIDIA's recipe (GlorotNormal kernel, N(0, 1/units) bias)."""
    return tf.keras.layers.Dense(
        units, activation=activation,
        kernel_initializer=tf.keras.initializers.GlorotNormal(seed=seed),
        bias_initializer=tf.keras.initializers.RandomNormal(stddev=math.sqrt(1.0 / units),
                                                            seed=None if seed is None else seed + 1),
        name=name)


class MLP(tf.keras.layers.Layer):
    """``[b, d_in] -> [b, dims[-1]]``: Dense+ReLU layers; the last one linear unless ``activate_last``.

    ``seed``: base seed of the initialisers (layer ``i`` uses ``seed + 2 i`` and ``seed + 2 i + 1``); ``None`` uses
    TensorFlow's global seed (``tf.keras.utils.set_random_seed``).
    """

    def __init__(self, dims: Sequence[int], activate_last: bool, seed: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        self.dims = [int(d) for d in dims]
        if not self.dims or any(d <= 0 for d in self.dims):
            raise ValueError(f"MLP dims must be a non-empty list of positive sizes, got {list(dims)}")
        self.activate_last = bool(activate_last)
        self.seed = seed
        self.dense_layers = []
        for i, units in enumerate(self.dims):
            last = i == len(self.dims) - 1
            activation = "relu" if (not last or self.activate_last) else None
            self.dense_layers.append(dense_layer(units, activation, None if seed is None else seed + 2 * i,
                                           name=f"dense_{i}"))

    def call(self, x):
        for layer in self.dense_layers:
            x = layer(x)
        return x

    def get_config(self):
        config = super().get_config()
        config.update(dims=self.dims, activate_last=self.activate_last, seed=self.seed)
        return config
