"""The whole DLRM / DCNv2 model: the sparse half (embedding tables, hybrid parallel) and the dense half.

``RecModel(sparse, dense)``; ``model((numerical, categorical), training=...) -> logits float32 [b, 1]``::

    embeddings = sparse(categorical)          list of num_tables float32 [b, dim_t] (all-to-all inside when N > 1)
    logits     = dense(numerical, embeddings) bottom MLP -> dot interaction or cross network -> top MLP

``build_model(...)`` builds both halves from explicit arguments (the flags' values); the sparse half is
``dlrm_dcnv2.model.sparse_model.create_sparse_model`` (our placement, or Merlin Distributed Embeddings).

Example (one process)::

    model = build_model(table_sizes=[1000, 500], embedding_dims=16, bottom_mlp_dims=[32, 16],
                        top_mlp_dims=[32, 1], interaction="dot_tensorflow", num_numerical_features=13)
    logits = model((tf.zeros([4, 13]), (tf.zeros([4], tf.int32), tf.zeros([4], tf.int32))))   # [4, 1]
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import tensorflow as tf

from dlrm_dcnv2.distributed import hvd_utils
from dlrm_dcnv2.model.dense_model import DenseModel
from dlrm_dcnv2.model.sparse_model import create_sparse_model


class RecModel(tf.keras.Model):
    """``sparse`` (``call(categorical) -> list of [b, dim_t]``) followed by ``dense`` (a ``DenseModel``)."""

    def __init__(self, sparse, dense: DenseModel, name: str = "rec_model"):
        super().__init__(name=name)
        self.sparse = sparse
        self.dense = dense

    def call(self, inputs, training=None):
        numerical, categorical = inputs
        embeddings = self.sparse(categorical, training=training)
        return self.dense(numerical, embeddings, training=training)

    def build_dense(self, num_numerical_features: int) -> None:
        """Create the dense half's weights with one batch-of-one forward pass of zeros (no collective, no lookup),
        e.g. before restoring a checkpoint or broadcasting the weights."""
        numerical = tf.zeros([1, num_numerical_features], tf.float32)
        embeddings = [tf.zeros([1, d], tf.float32) for d in self.dense.embedding_dims]
        self.dense(numerical, embeddings, training=False)

    @property
    def dense_variables(self):
        """Trainable variables of the dense half (dense optimizer)."""
        return self.dense.trainable_variables

    @property
    def embedding_variables(self):
        """Trainable variables of the sparse half (embedding optimizer)."""
        return self.sparse.trainable_variables


def build_model(table_sizes: Sequence[int], embedding_dims: Union[int, Sequence[int]],
                bottom_mlp_dims: Sequence[int], top_mlp_dims: Sequence[int], interaction: str,
                num_numerical_features: int, hotness: Union[int, Sequence[int]] = 1, num_cross_layers: int = 3,
                cross_layer_projection_dim: Optional[int] = 512, ctx=None, seed: Optional[int] = None,
                xla: bool = False, dist_strategy: str = "memory_balanced",
                column_slice_threshold: Optional[float] = None, row_slice_threshold: Optional[float] = None,
                data_parallel_threshold: Optional[float] = None,
                cpu_offloading_threshold_gb: Optional[float] = None, use_mde_embeddings: bool = False,
                embedding_zeros_initializer: bool = False, embedding_trainable: bool = True) -> RecModel:
    """A ``RecModel`` for the flags (names as the flags of reference A.3), dense weights created.

    ``ctx``: ``hvd_utils.Context`` (None: one process). ``seed``: seeds the tables (broadcast from rank 0 when None)
    and, when given, the dense initialisers (otherwise TensorFlow's global seed; the trainer broadcasts the dense
    weights from rank 0 anyway). Raises ``ValueError`` naming the flags for an impossible configuration.
    """
    if ctx is None:
        ctx = hvd_utils.Context()
    num_tables = len(table_sizes)
    dims = [int(embedding_dims)] * num_tables if isinstance(embedding_dims, int) else [int(d) for d in embedding_dims]
    # The dense half first: its flag checks (e.g. DLRM's bottom MLP vs embedding size) fail before any table is made.
    dense = DenseModel(bottom_mlp_dims, top_mlp_dims, interaction, num_cross_layers=num_cross_layers,
                       cross_layer_projection_dim=cross_layer_projection_dim, embedding_dims=dims,
                       num_numerical_features=num_numerical_features, xla=xla,
                       seed=None if seed is None else int(seed) + 1)
    sparse = create_sparse_model(table_sizes, dims, hotness, ctx, seed, strategy=dist_strategy,
                                 column_slice_threshold=column_slice_threshold,
                                 row_slice_threshold=row_slice_threshold,
                                 data_parallel_threshold=data_parallel_threshold,
                                 cpu_offloading_threshold_gb=cpu_offloading_threshold_gb,
                                 use_mde_embeddings=use_mde_embeddings,
                                 zeros_initializer=embedding_zeros_initializer, trainable=embedding_trainable)
    model = RecModel(sparse, dense)
    model.build_dense(num_numerical_features)
    return model
