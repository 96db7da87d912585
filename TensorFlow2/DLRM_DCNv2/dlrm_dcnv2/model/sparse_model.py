"""The sparse half of DLRM/DCNv2: every embedding table, placed hybrid-parallel across Horovod ranks.

``SparseModel(table_sizes, embedding_dims, hotness, placement, ctx, seed)`` holds one float32 variable per shard
this rank owns (see ``distributed.placement``) and maps the batch's categorical ids to one embedding per table::

    categorical (tuple, order = placement.input_tables(rank)):
        model-parallel table: ids of the WHOLE global batch, [B] or [B, hotness]
        data-parallel table:  ids of this rank's slice,      [b] or [b, hotness]       (b = B / world_size)
    -> list of num_tables float32 tensors [b, dim_t], table order, rows of this rank's slice of the batch

How (world size N, rank r):
1. each model-parallel shard of rank r is looked up for the global batch: ``[B, cols_s]`` (sum pooling of
   multi-hot ids, padding -1 ignored; a row slice gives zeros for ids outside its rows);
2. rank r concatenates its shards' columns into ``[B, W_r]`` and one ``hvd.alltoall`` sends rows
   ``[q*b, (q+1)*b)`` to rank q (flattened, so the ranks' widths ``W_q`` may differ);
3. rank r receives ``[b, W_q]`` from every rank q and rebuilds each table's ``[b, dim]``: column slices are
   concatenated, row slices summed;
4. data-parallel (replicated) tables are looked up locally for the local slice.

The all-to-all's gradient is the all-to-all back, so after backprop a model-parallel shard's gradient already sums
every rank's loss; ``distributed.gradients.reduce_gradients`` divides it by N (the loss is a per-rank mean) and
allreduces everything else. With N = 1 steps 2-3 are skipped.

Initial values: see ``model.embedding.initial_values`` (NVIDIA's U(-sqrt(1/rows), sqrt(1/rows)), drawn so that any
slice equals the slice of the one-rank table). ``seed=None`` draws a seed on rank 0 and broadcasts it.
"""
from __future__ import annotations

import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from dlrm_dcnv2.distributed import hvd_utils
from dlrm_dcnv2.distributed.placement import Placement, ShardSpec, plan_placement, variable_name
from dlrm_dcnv2.model.embedding import embedding_lookup, initial_value_blocks

LOG = logging.getLogger(__name__)


def _per_table(value: Union[int, Sequence[int]], num_tables: int, what: str) -> Tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * num_tables
    value = tuple(int(v) for v in value)
    if len(value) != num_tables:
        raise ValueError(f"{what}: {len(value)} values for {num_tables} tables")
    return value


class SparseModel(tf.keras.layers.Layer):
    """Embedding tables of one rank; ``call(categorical) -> list of [b, dim_t]`` (see the module docstring).

    ``table_sizes``: rows per table; ``embedding_dims``: one dim or one per table; ``hotness``: 1 (one-hot) or the
    max ids per sample, one value or one per table (recorded in the config; each lookup follows the shape of its
    ids: ``[B]`` one-hot, ``[B, h]`` summed); ``placement``: the plan for
    ``ctx.world_size`` ranks (``None``: one rank holds everything); ``zeros_initializer`` /``trainable``: NVIDIA's
    ``--embedding_zeros_initializer`` / ``--embedding_trainable``.
    """

    def __init__(self, table_sizes: Sequence[int], embedding_dims: Union[int, Sequence[int]],
                 hotness: Union[int, Sequence[int]] = 1, placement: Optional[Placement] = None,
                 ctx: Optional[hvd_utils.Context] = None, seed: Optional[int] = None,
                 zeros_initializer: bool = False, trainable: bool = True, name: str = "sparse_model"):
        # float32 whatever the global mixed-precision policy: embeddings are never stored in half precision.
        super().__init__(name=name, dtype="float32", trainable=trainable)
        self.table_sizes = tuple(int(n) for n in table_sizes)
        self.embedding_dims = _per_table(embedding_dims, len(self.table_sizes), "--embedding_dim")
        self.hotness = _per_table(hotness, len(self.table_sizes), "hotness")
        self.ctx = ctx if ctx is not None else hvd_utils.Context()
        if placement is None:
            placement = plan_placement(self.table_sizes, self.embedding_dims, self.ctx.world_size)
        if (placement.table_sizes != self.table_sizes or placement.embedding_dims != self.embedding_dims
                or placement.world_size != self.ctx.world_size):
            raise ValueError(f"the placement was planned for tables {placement.table_sizes} x dims "
                             f"{placement.embedding_dims} on {placement.world_size} rank(s), not tables "
                             f"{self.table_sizes} x dims {self.embedding_dims} on {self.ctx.world_size}")
        self.placement = placement
        if seed is None:
            seed = hvd_utils.broadcast_value(int.from_bytes(os.urandom(4), "little"))
        self.seed = int(seed)
        rank = self.ctx.rank
        self._input_tables = placement.input_tables(rank)
        self._input_index = {t: i for i, (t, _) in enumerate(self._input_tables)}
        self._shards: List[ShardSpec] = placement.local_shards(rank)
        # A list aligned with self._shards (Keras tracks attributes, and its dict wrapper sorts keys).
        self._shard_vars: List[tf.Variable] = [self._create_variable(s, zeros_initializer) for s in self._shards]
        # Every rank's model-parallel shards in all-to-all order (same list on every rank: the plan is global).
        self._sent = [placement.model_parallel_shards(q) for q in range(placement.world_size)]
        self._widths = [placement.rank_width(q) for q in range(placement.world_size)]

    def _create_variable(self, shard: ShardSpec, zeros: bool) -> tf.Variable:
        rows, dim = self.table_sizes[shard.table], self.embedding_dims[shard.table]
        device = "/CPU:0" if shard.offload_to_cpu else None
        with tf.device(device):
            variable = self.add_weight(name=variable_name(shard, rows, dim), shape=(shard.num_rows, shard.num_cols),
                                       dtype=tf.float32, initializer="zeros", trainable=self.trainable)
            if not zeros:
                # Filled block by block: a table of several GiB never exists twice in host memory.
                for offset, values in initial_value_blocks(rows, dim, self.seed, shard.table, shard.rows,
                                                           shard.cols):
                    variable[offset:offset + len(values)].assign(values)
        return variable

    # ---- what the trainer, the checkpoints and the tests need ----
    @property
    def shard_variables(self) -> List[Tuple[ShardSpec, tf.Variable]]:
        """Every variable of this rank with the piece of which table it holds."""
        return list(zip(self._shards, self._shard_vars))

    @property
    def model_parallel_variables(self) -> List[tf.Variable]:
        """Variables of the shards only this rank holds (gradient rule: divided by world size, never allreduced)."""
        return [v for s, v in self.shard_variables if not s.data_parallel]

    @property
    def data_parallel_variables(self) -> List[tf.Variable]:
        """Replicated tables (broadcast at start and allreduced like the MLPs)."""
        return [v for s, v in self.shard_variables if s.data_parallel]

    @property
    def input_tables(self) -> List[Tuple[int, bool]]:
        return list(self._input_tables)

    # ---- forward ----
    def call(self, categorical, training=None):
        categorical = list(categorical)
        if len(categorical) != len(self._input_tables):
            raise ValueError(f"rank {self.ctx.rank} expects ids of {len(self._input_tables)} tables "
                             f"{[t for t, _ in self._input_tables]}, got {len(categorical)} tensors")
        ids = {t: categorical[i] for t, i in self._input_index.items()}
        outputs: List[Optional[tf.Tensor]] = [None] * len(self.table_sizes)

        if self.placement.model_parallel_tables:
            pieces: Dict[int, List[Tuple[ShardSpec, tf.Tensor]]] = {}
            for q, columns in enumerate(self._exchange(ids)):
                for shard, value in zip(self._sent[q], columns):
                    pieces.setdefault(shard.table, []).append((shard, value))
            for table, parts in pieces.items():
                outputs[table] = _assemble(parts)
        for shard, var in self.shard_variables:
            if shard.data_parallel:
                outputs[shard.table] = embedding_lookup(var, ids[shard.table])
        return outputs

    def _exchange(self, ids) -> List[List[tf.Tensor]]:
        """Look up this rank's shards for the global batch; return, for each rank q, the ``[b, cols_s]`` piece of
        every shard s that q sent (``self._sent[q]`` order).

        Pieces are cut with one ``tf.split`` per rank (whose gradient is one concat), not with a column slice per
        shard: a slice's gradient is a zero-filled ``[b, W_q]`` tensor per shard summed by an ``AddN``, which was
        about a fifth of a one-rank Kaggle-shape step (issue 18 profile). One rank skips the concat and the split."""
        mine = []
        for shard in self._sent[self.ctx.rank]:
            whole_rows = shard.rows == (0, self.table_sizes[shard.table])
            var = self._shard_vars[self._shards.index(shard)]
            mine.append(embedding_lookup(var, ids[shard.table],
                                         row_start=shard.rows[0], row_count=None if whole_rows else shard.num_rows))
        world = self.ctx.world_size
        if world == 1:
            return [mine]
        local = mine[0] if len(mine) == 1 else tf.concat(mine, axis=1)
        width = self._widths[self.ctx.rank]
        local_batch = tf.shape(local)[0] // world
        # Row-major flattening keeps rows [q*b, (q+1)*b) contiguous: chunk q of the flat tensor goes to rank q.
        # Flat 1-D pieces let every rank send a different width.
        flat = tf.reshape(local, [-1])
        received = hvd_utils.alltoall(flat, tf.fill([world], local_batch * width), name="sparse_alltoall")
        sizes = tf.stack([local_batch * w for w in self._widths])
        blocks = tf.split(received, sizes, num=world)
        return [tf.split(tf.reshape(block, [local_batch, w]), [s.num_cols for s in sent], axis=1)
                if len(sent) > 1 else [tf.reshape(block, [local_batch, w])]
                for block, w, sent in zip(blocks, self._widths, self._sent)]

    def get_config(self):
        return {"table_sizes": list(self.table_sizes), "embedding_dims": list(self.embedding_dims),
                "hotness": list(self.hotness), "seed": self.seed, "name": self.name}


def _assemble(parts: List[Tuple[ShardSpec, tf.Tensor]]) -> tf.Tensor:
    """One table's ``[b, dim]`` from its pieces: columns concatenated in order within a row range, row ranges summed."""
    by_rows: Dict[Tuple[int, int], List[Tuple[ShardSpec, tf.Tensor]]] = {}
    for shard, value in parts:
        by_rows.setdefault(shard.rows, []).append((shard, value))
    total = None
    for row_range in sorted(by_rows):
        columns = [v for _, v in sorted(by_rows[row_range], key=lambda p: p[0].cols)]
        value = columns[0] if len(columns) == 1 else tf.concat(columns, axis=1)
        total = value if total is None else total + value
    return total


# ---------------------------------------------------------------------------------------------------------------
# --use_mde_embeddings: Merlin Distributed Embeddings (NVIDIA's path; only in NGC images, not on PyPI)
# ---------------------------------------------------------------------------------------------------------------

def mde_available() -> bool:
    """True when ``distributed_embeddings`` (Merlin Distributed Embeddings) imports."""
    try:
        import distributed_embeddings.python.layers.dist_model_parallel  # noqa: F401
    except ImportError:
        return False
    return True


class _MDEPlacement:
    """What the data loader asks of a placement, answered from MDE's own plan (``strategy.input_ids_list``)."""

    def __init__(self, distributed_embedding, table_sizes, embedding_dims, world_size):
        self._ids = distributed_embedding.strategy.input_ids_list
        self.table_sizes, self.embedding_dims, self.world_size = table_sizes, embedding_dims, world_size
        self.strategy = "mde"

    def input_tables(self, rank: int) -> List[Tuple[int, bool]]:
        return [(int(t), True) for t in self._ids[rank]]

    def describe(self) -> str:
        return "placement by Merlin Distributed Embeddings: " + "; ".join(
            f"rank {r}: tables {list(map(int, ids))}" for r, ids in enumerate(self._ids))


class MDESparseModel(tf.keras.layers.Layer):
    """SparseModel's interface over ``distributed_embeddings.dist_model_parallel.DistributedEmbedding``.

    Thin on purpose: MDE needs CUDA and is built inside NGC images, so this path cannot run on our CPU machines
    and is untested here. MDE does its own placement (same flags), all-to-all and slicing; inputs are
    model-parallel (``dp_input=False``: each rank reads the whole global batch of its tables, in the order of
    ``placement.input_tables(rank)``), multi-hot ids are passed as ragged tensors (the -1 padding dropped) with
    ``combiner='sum'``. Initial values: U(-sqrt(1/rows), sqrt(1/rows)) per table as NVIDIA's (seeded per table,
    but not slice-identical to our placement's). ``model_parallel_variables``: the weights of MDE's local
    (model-parallel) layers; everything else is allreduced by ``reduce_gradients`` as usual. It has no
    ``shard_variables``, so the recipe's checkpoints refuse it (``cli.check_flags`` refuses the flags up front).
    """

    def __init__(self, table_sizes, embedding_dims, hotness, ctx, seed, strategy, column_slice_threshold,
                 row_slice_threshold, data_parallel_threshold, cpu_offloading_threshold_gb, trainable=True,
                 zeros_initializer=False, name="sparse_model"):
        super().__init__(name=name, dtype="float32", trainable=trainable)
        from distributed_embeddings.python.layers import dist_model_parallel as dmp
        from distributed_embeddings.python.layers import embedding as mde_embedding
        self.table_sizes = tuple(int(n) for n in table_sizes)
        self.embedding_dims = _per_table(embedding_dims, len(self.table_sizes), "--embedding_dim")
        self.hotness = _per_table(hotness, len(self.table_sizes), "hotness")
        self.ctx, self.seed = ctx, int(seed)
        layers = []
        for t, (rows, dim, hot) in enumerate(zip(self.table_sizes, self.embedding_dims, self.hotness)):
            bound = (1.0 / rows) ** 0.5
            init = (tf.keras.initializers.Zeros() if zeros_initializer
                    else tf.keras.initializers.RandomUniform(-bound, bound, seed=self.seed + t))
            layers.append(mde_embedding.Embedding(rows, dim, embeddings_initializer=init,
                                                  combiner="sum" if hot > 1 else None))
        gpu_elements = None if cpu_offloading_threshold_gb is None else int(cpu_offloading_threshold_gb * 2 ** 30 / 4)
        self.embedding = dmp.DistributedEmbedding(
            layers, strategy=strategy, dp_input=False, column_slice_threshold=column_slice_threshold,
            row_slice_threshold=row_slice_threshold, data_parallel_threshold=data_parallel_threshold,
            gpu_embedding_size=gpu_elements)
        self.placement = _MDEPlacement(self.embedding, self.table_sizes, self.embedding_dims, ctx.world_size)
        self._input_tables = self.placement.input_tables(ctx.rank)

    @property
    def input_tables(self) -> List[Tuple[int, bool]]:
        return list(self._input_tables)

    @property
    def model_parallel_variables(self) -> List[tf.Variable]:
        local = getattr(self.embedding, "local_embedding_layers", None)
        if local is None:
            raise NotImplementedError("this distributed_embeddings version has no local_embedding_layers: the recipe "
                                      "was written against NVIDIA's pinned commit 45cffaa8 (see the Dockerfile)")
        return [w for layer in local for w in layer.trainable_weights]

    def call(self, categorical, training=None):
        inputs = []
        for (table, _), ids in zip(self._input_tables, categorical):
            if self.hotness[table] > 1:
                ids = tf.ragged.boolean_mask(ids, ids >= 0)  # MDE pools ragged rows; -1 is our padding
            inputs.append(ids)
        return [tf.cast(out, tf.float32) for out in self.embedding(inputs)]


def create_sparse_model(table_sizes: Sequence[int], embedding_dims: Union[int, Sequence[int]],
                        hotness: Union[int, Sequence[int]], ctx: hvd_utils.Context, seed: Optional[int],
                        strategy: str = "memory_balanced", column_slice_threshold: Optional[float] = None,
                        row_slice_threshold: Optional[float] = None, data_parallel_threshold: Optional[float] = None,
                        cpu_offloading_threshold_gb: Optional[float] = None, use_mde_embeddings: bool = False,
                        zeros_initializer: bool = False, trainable: bool = True):
    """The sparse model for the flags: MDE's when ``use_mde_embeddings`` and it is installed, else ours.

    Either way the result has ``placement`` (pass it to the data loader: ``placement.input_tables(rank)``),
    ``model_parallel_variables`` and ``call(categorical) -> list of [b, dim_t]``.
    """
    if use_mde_embeddings and mde_available():
        LOG.info("--use_mde_embeddings: embeddings placed by Merlin Distributed Embeddings")
        if seed is None:
            seed = hvd_utils.broadcast_value(int.from_bytes(os.urandom(4), "little"))
        return MDESparseModel(table_sizes, embedding_dims, hotness, ctx, seed, strategy, column_slice_threshold,
                              row_slice_threshold, data_parallel_threshold, cpu_offloading_threshold_gb,
                              trainable=trainable, zeros_initializer=zeros_initializer)
    if use_mde_embeddings and ctx.is_chief:
        LOG.warning("--use_mde_embeddings: distributed_embeddings (Merlin Distributed Embeddings) is not installed "
                    "(it ships in NGC images only): using this recipe's own placement and all-to-all")
    dims = _per_table(embedding_dims, len(table_sizes), "--embedding_dim")
    placement = plan_placement(table_sizes, dims, ctx.world_size, strategy, column_slice_threshold,
                               row_slice_threshold, data_parallel_threshold, cpu_offloading_threshold_gb)
    if ctx.is_chief:
        LOG.info("%s", placement.describe())
    return SparseModel(table_sizes, dims, hotness, placement, ctx, seed, zeros_initializer=zeros_initializer,
                       trainable=trainable)
