"""DCNv2's low-rank cross network (Wang et al. 2021, "DCN V2", eq. 2), written for this recipe.

One cross layer, with ``x_0`` the network's input and ``x_l`` the previous layer's output, both ``[b, d]``:

    x_{l+1} = x_0 * (U (V x_l) + b) + x_l          (* = element-wise product)

``V``: ``d -> r`` (no bias), ``U``: ``r -> d``, ``b``: ``[d]``, ``r = projection_dim``; ``projection_dim=None`` uses
one full-rank ``d x d`` matrix ``W`` instead of ``U V``. In row-vector form (what the code computes)
``x_{l+1} = x_0 * ((x_l V^T) U^T + b) + x_l`` with kernels stored ``[d, r]`` and ``[r, d]``.

Initialisation as NVIDIA's recipe (whose ``nn/dcn.py`` is TensorFlow Recommenders' ``Cross`` layer with its
defaults): kernels truncated normal with stddev 0.05 (Keras' ``"truncated_normal"``), bias zeros, no diagonal
scaling. ``CrossNetwork(num_layers, projection_dim)`` stacks ``num_layers`` of them, each crossing with the same
``x_0``. DCNv2 in this recipe (as NVIDIA's): ``x_0 = concat(bottom MLP output, embeddings)``, the cross network's
output goes straight into the top MLP (stacked, no parallel deep tower).

Example::

    net = CrossNetwork(num_layers=3, projection_dim=512)
    y = net(tf.ones([8, 3456]))          # [8, 3456]
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

CROSS_KERNEL_STDDEV = 0.05


def _kernel_init(seed: Optional[int]):
    return tf.keras.initializers.TruncatedNormal(mean=0.0, stddev=CROSS_KERNEL_STDDEV, seed=seed)


class CrossLayer(tf.keras.layers.Layer):
    """``call(x0, x) -> x0 * (U(V x) + b) + x`` (all ``[b, d]``); ``x=None`` means ``x = x0`` (the first layer).

    Weights: ``v_kernel [d, r]``, ``u_kernel [r, d]``, ``bias [d]`` (or ``kernel [d, d]`` when
    ``projection_dim is None``).
    """

    def __init__(self, projection_dim: Optional[int] = None, seed: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        if projection_dim is not None and int(projection_dim) <= 0:
            raise ValueError(f"--cross_layer_projection_dim must be positive, got {projection_dim}")
        self.projection_dim = None if projection_dim is None else int(projection_dim)
        self.seed = seed

    def build(self, input_shape):
        dim = int(input_shape[-1])
        seed = self.seed
        if self.projection_dim is None:
            self.kernel = self.add_weight("kernel", [dim, dim], initializer=_kernel_init(seed))
        else:
            self.v_kernel = self.add_weight("v_kernel", [dim, self.projection_dim], initializer=_kernel_init(seed))
            self.u_kernel = self.add_weight("u_kernel", [self.projection_dim, dim],
                                            initializer=_kernel_init(None if seed is None else seed + 1))
        self.bias = self.add_weight("bias", [dim], initializer="zeros")
        super().build(input_shape)

    def call(self, x0, x=None):
        x0 = tf.cast(x0, self.compute_dtype)
        x = x0 if x is None else tf.cast(x, self.compute_dtype)
        if x0.shape[-1] != x.shape[-1]:
            raise ValueError(f"cross layer: x0 has {x0.shape[-1]} features, x has {x.shape[-1]}")
        if self.projection_dim is None:
            projected = tf.matmul(x, self.kernel)
        else:
            projected = tf.matmul(tf.matmul(x, self.v_kernel), self.u_kernel)
        return x0 * (projected + self.bias) + x

    def get_config(self):
        config = super().get_config()
        config.update(projection_dim=self.projection_dim, seed=self.seed)
        return config


class CrossNetwork(tf.keras.layers.Layer):
    """``num_layers`` cross layers: ``x_1 = C_0(x_0, x_0)``, ``x_{l+1} = C_l(x_0, x_l)``; ``call(x0) -> x_L``."""

    def __init__(self, num_layers: int, projection_dim: Optional[int] = None, seed: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        if int(num_layers) < 1:
            raise ValueError(f"--num_cross_layers must be at least 1, got {num_layers}")
        self.num_layers = int(num_layers)
        self.projection_dim = projection_dim
        self.seed = seed
        self.cross_layers = [CrossLayer(projection_dim, seed=None if seed is None else seed + 2 * i,
                                        name=f"cross_{i}") for i in range(self.num_layers)]

    def call(self, x0):
        x0 = tf.cast(x0, self.compute_dtype)
        x = x0
        for layer in self.cross_layers:
            x = layer(x0, x)
        return x

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, projection_dim=self.projection_dim, seed=self.seed)
        return config
