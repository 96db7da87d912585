"""The dense (data-parallel) half of DLRM and DCNv2: bottom MLP, interaction, top MLP.

``DenseModel(...)``; ``call(numerical [b, num_numerical], embeddings: list of [b, dim_t]) -> logits float32 [b, 1]``.

    bottom = MLP_bottom(pad8(numerical))                          ReLU after every layer, [b, bottom_mlp_dims[-1]]
    DLRM:   z = dot_interaction(bottom, embeddings)               [b, d + F (F-1)/2], F = num_tables + 1
    DCNv2:  z = CrossNetwork(concat(bottom, e_1, ..., e_n))       [b, bottom_mlp_dims[-1] + sum(dim_t)]
    logit = MLP_top(pad8(z))                                      last layer linear, [b, 1], cast to float32

``pad8`` appends zero columns up to a multiple of 8, as NVIDIA's dense model does (13 numericals -> 16; DLRM's
top input e.g. 128 + 351 = 479 -> 480): the extra kernel rows see only zeros (their gradient is zero), so the
model computes the same function as an unpadded one whose first-layer Glorot scale uses the padded fan-in, i.e.
NVIDIA's initial statistics; the widths also suit tensor cores on GPU.

With no numerical features (``num_numerical_features == 0``) there is no bottom MLP: DLRM interacts the
embeddings only (``F = num_tables``), DCNv2 crosses the concatenated embeddings.

Mixed precision: the layers follow the global Keras policy at construction (``mixed_bfloat16`` /
``mixed_float16``: float32 variables, half-precision compute); embeddings arrive float32 and are cast to the
compute dtype; the logits are always returned float32.
"""
from __future__ import annotations

import logging
import math
from typing import List, Optional, Sequence, Union

import tensorflow as tf

from dlrm_dcnv2.model import interaction as interaction_lib
from dlrm_dcnv2.model.mlp import MLP

LOG = logging.getLogger(__name__)

PAD_MULTIPLE = 8


def padding_to_multiple(width: int, multiple: int = PAD_MULTIPLE) -> int:
    """Zero columns needed to round ``width`` up to a multiple of ``multiple``."""
    return int(math.ceil(width / multiple) * multiple) - width


class DenseModel(tf.keras.Model):
    """Bottom MLP + interaction + top MLP (see the module docstring).

    ``bottom_mlp_dims`` / ``top_mlp_dims``: layer widths (``--bottom_mlp_dims``/``--top_mlp_dims``; the top MLP
    must end with 1); ``interaction``: ``dot_custom_cuda`` | ``dot_tensorflow`` | ``cross`` (``--interaction``);
    ``num_cross_layers``, ``cross_layer_projection_dim``: DCNv2's cross network; ``embedding_dims``: one int or
    one per table (``--embedding_dim``); ``num_numerical_features``: None = infer from the first batch (only 0
    changes the structure); ``xla``: ``--xla`` (refuses the custom CUDA op); ``seed``: initialiser seed (None =
    TensorFlow's global seed).

    Raises ``ValueError`` naming the flags when DLRM's bottom MLP output size differs from the embedding size or
    the embedding sizes differ.
    """

    def __init__(self, bottom_mlp_dims: Sequence[int], top_mlp_dims: Sequence[int], interaction: str,
                 num_cross_layers: int = 3, cross_layer_projection_dim: Optional[int] = 512,
                 embedding_dims: Union[int, Sequence[int]] = 128, num_tables: Optional[int] = None,
                 num_numerical_features: Optional[int] = None, xla: bool = False, seed: Optional[int] = None,
                 name: str = "dense_model"):
        super().__init__(name=name)
        self.bottom_mlp_dims = [int(d) for d in bottom_mlp_dims]
        self.top_mlp_dims = [int(d) for d in top_mlp_dims]
        if isinstance(embedding_dims, int):
            if num_tables is None:
                raise ValueError("DenseModel: give num_tables with a single embedding dim")
            embedding_dims = [embedding_dims] * int(num_tables)
        self.embedding_dims = [int(d) for d in embedding_dims]
        self.interaction_name = interaction
        self.num_cross_layers = int(num_cross_layers)
        self.cross_layer_projection_dim = cross_layer_projection_dim
        self.num_numerical_features = num_numerical_features
        self.seed = seed
        if not self.top_mlp_dims or self.top_mlp_dims[-1] != 1:
            raise ValueError(f"--top_mlp_dims must end with 1 (the logit), got {self.top_mlp_dims}")
        if not self.bottom_mlp_dims and num_numerical_features != 0:
            raise ValueError("--bottom_mlp_dims is empty but the data has numerical features")
        self.is_dlrm = interaction != "cross"
        if self.is_dlrm:
            if len(set(self.embedding_dims)) > 1:
                raise ValueError(f"--interaction {interaction} (DLRM) needs one embedding size for every table, "
                                 f"got --embedding_dim {self.embedding_dims}; use --interaction cross (DCNv2) "
                                 f"for different sizes")
            if num_numerical_features != 0 and self.bottom_mlp_dims[-1] != self.embedding_dims[0]:
                raise ValueError(f"--interaction {interaction} (DLRM): the last of --bottom_mlp_dims "
                                 f"({self.bottom_mlp_dims[-1]}) must equal --embedding_dim "
                                 f"({self.embedding_dims[0]}): the dot interaction pairs the bottom MLP output "
                                 f"with every embedding")
        self.bottom_mlp = (MLP(self.bottom_mlp_dims, activate_last=True, seed=seed, name="bottom_mlp")
                           if self.bottom_mlp_dims else None)
        self.interaction, self.interaction_note = interaction_lib.select_interaction(
            interaction, xla, num_cross_layers, cross_layer_projection_dim,
            seed=None if seed is None else seed + 1000)
        interaction_lib.log_selection(self.interaction_note)
        self.uses_custom_op = isinstance(self.interaction, interaction_lib.CudaDotInteraction)
        self.top_mlp = MLP(self.top_mlp_dims, activate_last=False, seed=None if seed is None else seed + 500,
                           name="top_mlp")

    def call(self, numerical, embeddings: List[tf.Tensor], training=None):
        embeddings = list(embeddings)
        if len(embeddings) != len(self.embedding_dims):
            raise ValueError(f"DenseModel expects {len(self.embedding_dims)} embeddings, got {len(embeddings)}")
        num_numerical = int(numerical.shape[-1])
        if self.num_numerical_features is not None and num_numerical != self.num_numerical_features:
            raise ValueError(f"DenseModel built for {self.num_numerical_features} numerical features, "
                             f"got {num_numerical}")
        embeddings = [tf.cast(e, self.compute_dtype) for e in embeddings]
        bottom = None
        if num_numerical:
            x = tf.cast(numerical, self.compute_dtype)
            pad = padding_to_multiple(num_numerical)
            if pad:
                x = tf.pad(x, [[0, 0], [0, pad]])
            bottom = self.bottom_mlp(x)
        if self.is_dlrm:
            z = self.interaction(bottom, embeddings)
        else:
            z = tf.concat(([bottom] if bottom is not None else []) + embeddings, axis=1)
            z = self.interaction(z)
        pad = padding_to_multiple(int(z.shape[-1]))
        if pad:
            z = tf.pad(z, [[0, 0], [0, pad]])
        return tf.cast(self.top_mlp(z), tf.float32)

    def get_config(self):
        return {"bottom_mlp_dims": self.bottom_mlp_dims, "top_mlp_dims": self.top_mlp_dims,
                "interaction": self.interaction_name, "num_cross_layers": self.num_cross_layers,
                "cross_layer_projection_dim": self.cross_layer_projection_dim, "embedding_dims": self.embedding_dims,
                "num_numerical_features": self.num_numerical_features, "seed": self.seed}
