"""DLRM's dot interaction, written in plain TensorFlow ops so XLA can fuse it, and ``--interaction`` selection.

Math (DLRM paper, section 2.1.3; NVIDIA's ``DotInteractionGather``). With the bottom MLP output ``z_0`` and the
embeddings ``z_1 .. z_n`` of one sample, all ``[d]``, stacked as ``Z = [z_0; z_1; ...; z_n]`` (``F = n + 1`` rows):

    G = Z Z^T                                        Gram matrix  [F, F],  G[i, j] = <z_i, z_j>
    t = (G[1,0], G[2,0], G[2,1], G[3,0], G[3,1], G[3,2], ..., G[F-1,F-2])     strictly lower triangle, row by row
    output = concat(z_0, t)                          [d + F (F - 1) / 2]

Layout = NVIDIA's TF2 ``dot_tensorflow`` (gather of the lower-triangle indices ``i * F + j``, ``j < i``, bottom MLP
output first), which is also the layout of the custom CUDA kernel's output. Because ``G`` is symmetric, ``t`` holds
the same numbers as the strictly upper triangle read column by column. ``self_interaction=True`` adds the diagonal
(``j <= i``). Padding: NVIDIA pads the top MLP's input with zero columns to a multiple of 8 (the CUDA kernel's
output is already rounded up to a multiple of 8; for ``dot_tensorflow`` NVIDIA's dense model appends the zeros).
This layer returns the unpadded ``[b, d + F (F - 1) / 2]``; ``DenseModel`` appends the zero columns for both
interactions, so the top MLP has the same input width and layout either way.

With no bottom MLP output (a dataset without numerical features) the layer interacts the embeddings only and
returns ``t`` alone (``F = n``).

``--interaction dot_custom_cuda`` is NVIDIA's CUDA kernel (pip package ``tensorflow_dot_based_interact``, built in
their Dockerfile). ``select_interaction(name, xla)`` decides what runs:

* package not importable, or no GPU visible -> ``DotInteraction`` (identical output), with a note to log;
* package importable and ``xla`` -> ``ValueError``: XLA cannot compile a custom op (use
  ``--interaction dot_tensorflow`` or drop ``--xla``);
* package importable, a GPU, no ``xla`` -> the CUDA kernel.
"""
from __future__ import annotations

import importlib
import logging
from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

from dlrm_dcnv2.model.dcn import CrossNetwork

LOG = logging.getLogger(__name__)

CUSTOM_OP_MODULE = "tensorflow_dot_based_interact.python.ops.dot_based_interact_ops"
INTERACTIONS = ("dot_custom_cuda", "dot_tensorflow", "cross")


def pair_indices(num_features: int, self_interaction: bool = False) -> List[int]:
    """Flat indices ``i * F + j`` (``j < i``, or ``j <= i`` with self-interaction) of ``G`` reshaped to ``[F*F]``."""
    return [i * num_features + j for i in range(num_features) for j in range(i + (1 if self_interaction else 0))]


def num_interactions(num_features: int, self_interaction: bool = False) -> int:
    """Number of Gram-matrix entries the layer keeps for ``num_features`` stacked vectors."""
    return num_features * (num_features + (1 if self_interaction else -1)) // 2


class DotInteraction(tf.keras.layers.Layer):
    """``call(bottom_mlp_output [b, d] or None, embeddings: list of n [b, d]) -> [b, d + F (F-1)/2]`` (see module).

    Example::

        layer = DotInteraction()
        out = layer(tf.ones([4, 8]), [tf.ones([4, 8])] * 3)      # [4, 8 + 6]
    """

    def __init__(self, self_interaction: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.self_interaction = bool(self_interaction)

    def call(self, bottom_mlp_output, embeddings):
        features = list(embeddings)
        if bottom_mlp_output is not None:
            features = [bottom_mlp_output] + features
        if not features:
            raise ValueError("DotInteraction needs at least one feature vector")
        dims = {int(f.shape[-1]) for f in features}
        if len(dims) != 1:
            raise ValueError(f"dot interaction: every vector must have the same size (bottom MLP output and "
                             f"embeddings), got sizes {[int(f.shape[-1]) for f in features]}")
        features = [tf.cast(f, self.compute_dtype) for f in features]
        num_features = len(features)
        stacked = tf.stack(features, axis=1)                                   # [b, F, d]
        gram = tf.matmul(stacked, stacked, transpose_b=True)                   # [b, F, F]
        flat = tf.reshape(gram, [-1, num_features * num_features])
        # A gather with constant indices keeps the shape static: XLA fuses it (tf.boolean_mask would not compile).
        # It gathers rows of the transposed matrix: contiguous copies of b values, where a gather of columns runs
        # element by element (forward + backward 1.7 vs 6.1 ms at b = 2048, F = 27, bf16, 2-core AMD EPYC, 2026-11-25).
        indices = pair_indices(num_features, self.self_interaction)
        pairs = tf.transpose(tf.gather(tf.transpose(flat), indices))
        if bottom_mlp_output is None:
            return pairs
        return tf.concat([features[0], pairs], axis=1)

    def get_config(self):
        config = super().get_config()
        config.update(self_interaction=self.self_interaction)
        return config


class CudaDotInteraction(tf.keras.layers.Layer):
    """NVIDIA's ``dot_based_interact`` CUDA kernel (GPU only, not XLA-compilable); same layout as ``DotInteraction``
    with the zero padding to a multiple of 8 already included."""

    def __init__(self, op, **kwargs):
        super().__init__(**kwargs)
        self._op = op

    def call(self, bottom_mlp_output, embeddings):
        if bottom_mlp_output is None:
            raise ValueError("--interaction dot_custom_cuda needs numerical features (a bottom MLP output); "
                             "use --interaction dot_tensorflow")
        features = [tf.cast(f, self.compute_dtype) for f in [bottom_mlp_output] + list(embeddings)]
        return self._op(tf.stack(features, axis=1), features[0])


def custom_dot_op():
    """NVIDIA's ``dot_based_interact`` op when ``tensorflow_dot_based_interact`` imports, else None."""
    try:
        module = importlib.import_module(CUSTOM_OP_MODULE)
    except Exception:  # not installed, or built against another TF (NotFoundError on load): both mean "absent"
        return None
    return getattr(module, "dot_based_interact", None)


def _gpu_visible() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


def select_interaction(name: str, xla: bool, num_cross_layers: int = 3,
                       cross_layer_projection_dim: Optional[int] = 512, on_gpu: Optional[bool] = None,
                       seed: Optional[int] = None) -> Tuple[tf.keras.layers.Layer, Optional[str]]:
    """The interaction layer for ``--interaction name`` and ``--xla``: ``(layer, note)``.

    ``note`` is a sentence to log when the request was changed (``dot_custom_cuda`` unavailable), else None.
    Raises ``ValueError`` naming the flags for an unknown name or ``dot_custom_cuda`` with ``--xla``.
    ``on_gpu``: whether the model runs on a GPU (default: whether TensorFlow sees one).
    """
    if name == "dot_tensorflow":
        return DotInteraction(name="interaction"), None
    if name == "cross":
        return CrossNetwork(num_cross_layers, cross_layer_projection_dim, seed=seed, name="interaction"), None
    if name != "dot_custom_cuda":
        raise ValueError(f"--interaction {name!r}: expected one of {', '.join(INTERACTIONS)}")
    op = custom_dot_op()
    if op is None:
        return DotInteraction(name="interaction"), (
            "--interaction dot_custom_cuda: NVIDIA's tensorflow_dot_based_interact kernel is not installed (it is "
            "built in the NGC Dockerfile); using dot_tensorflow, which computes the same output layout")
    if xla:
        raise ValueError("--interaction dot_custom_cuda with --xla: XLA cannot compile the custom CUDA "
                         "dot-interaction op; use --interaction dot_tensorflow with --xla, or drop --xla")
    if on_gpu is None:
        on_gpu = _gpu_visible()
    if not on_gpu:
        return DotInteraction(name="interaction"), (
            "--interaction dot_custom_cuda: the CUDA kernel needs a GPU and none is visible; using dot_tensorflow, "
            "which computes the same output layout")
    return CudaDotInteraction(op, name="interaction"), None


def log_selection(note: Optional[str]) -> None:
    """Log ``select_interaction``'s note (if any) once."""
    if note:
        LOG.warning("%s", note)


__all__: Sequence[str] = ("DotInteraction", "CudaDotInteraction", "select_interaction", "custom_dot_op",
                          "pair_indices", "num_interactions", "INTERACTIONS")
