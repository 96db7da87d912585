"""Worker of tests/test_distributed.py: trains a tiny model over SparseModel on fixed global batches.

Run as ``python hybrid_parallel_worker.py OUT_DIR`` (one process) or under ``horovodrun -np 2 --gloo``; every
placement configuration below is trained in turn (same process: one start-up for all), each from the same
seeds, on the same global batches. Rank ``r`` writes ``OUT_DIR/rank<r>.json``: per configuration the
global-batch loss of each step (allreduced mean of the ranks' losses) and the final logits of a fixed global
evaluation batch (allgathered in rank order), which must not depend on the number of ranks.

The model (logits = Dense(concat(numerical, embeddings of every table)), the recipe's SGD or Adam pair from
``create_optimizers``) is deliberately minimal: it exercises exactly this helper's parts (placement, all-to-all
forward/backward, gradient rule, broadcast of the replicated variables); the full DLRM/DCNv2 equality runs through
dlrm.py/dcnv2.py in the same test file.

The ``adam_sliced`` configuration uses tables larger than the batches touch (:data:`LARGE_TABLE_SIZES`), row-
and column-sliced and replicated, one-hot and multi-hot, with the lazy Adam of the embeddings. Every rank also
reports its final table pieces and, over all steps, the largest change of a row in a step that did not look it up
(lazy Adam must leave such a row's bits alone). The first row of every table and of its second half (the first row
of each rank's row slice, where padding and out-of-slice ids are redirected inside a lookup) is looked up in the
first step only: a zero gradient counted as a touch would then move it in the later steps, by its momentum.
"""
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dlrm_dcnv2.distributed import hvd_utils  # noqa: E402
from dlrm_dcnv2.distributed.gradients import broadcast_replicated_variables, reduce_gradients  # noqa: E402
from dlrm_dcnv2.distributed.placement import plan_placement  # noqa: E402
from dlrm_dcnv2.model.optimizers import create_optimizers  # noqa: E402
from dlrm_dcnv2.model.sparse_model import SparseModel  # noqa: E402

TABLE_SIZES = [60, 40, 30, 25, 12, 6]
# Same dims and hotness; 6 steps of 32 samples look up at most ~1/3 of the rows of each.
LARGE_TABLE_SIZES = [600, 400, 300, 250, 120, 100]
SEED = 11
DIMS = [8, 8, 6, 8, 4, 8]
HOTNESS = [1, 3, 1, 2, 1, 4]
GLOBAL_BATCH = 32
STEPS = 6
CONFIGS = {
    "table_wise": {},
    "basic": {"strategy": "basic"},
    # 60 x 8 = 480 elements > 300: two column slices; 40 x 8 = 320 > 300 but under the row threshold too.
    "column_sliced": {"column_slice_threshold": 300},
    # Tables of more than 200 elements are cut by rows, the others placed whole.
    "row_sliced": {"row_slice_threshold": 200, "column_slice_threshold": 100},
    # Tables under 60 elements are replicated and looked up on the local batch slice.
    "data_parallel": {"data_parallel_threshold": 60, "column_slice_threshold": 300},
    # The step XLA-compiled (hvd_utils.compile_step: jit_compile on one rank, auto-clustering on several).
    "xla": {"column_slice_threshold": 300, "xla": True},
    # Large tables, Adam (lazy for the embeddings): tables 0 (one-hot), 1 (3-hot) and 3 (2-hot) cut by rows,
    # table 2 by columns, tables 4 (one-hot) and 5 (4-hot) replicated.
    "adam_sliced": {"optimizer": "adam", "large": True, "row_slice_threshold": 1900,
                    "column_slice_threshold": 1000, "data_parallel_threshold": 900},
}
LARGE_CONFIGS = [name for name, config in CONFIGS.items() if config.get("large")]


def global_batches(rng, count, table_sizes=TABLE_SIZES, slice_starts_once=False):
    """``count`` batches ``(numerical, ids per table, labels)``; ``slice_starts_once``: the first row of each table
    and of its second half (the row slices of 2 ranks) are looked up in the first batch and in no other."""
    batches = []
    for step in range(count):
        numerical = rng.normal(size=(GLOBAL_BATCH, 3)).astype(np.float32)
        ids = []
        for rows, hot in zip(table_sizes, HOTNESS):
            if hot == 1:
                drawn = rng.integers(0, rows, size=GLOBAL_BATCH).astype(np.int32)
            else:
                drawn = rng.integers(0, rows, size=(GLOBAL_BATCH, hot)).astype(np.int32)
            if hot > 1:
                drawn[rng.random(size=drawn.shape) < 0.3] = -1  # padding
            if slice_starts_once:
                for sample, start in enumerate((0, (rows + 1) // 2)):
                    drawn[drawn == start] = start + 1
                    if step == 0:
                        drawn[sample if hot == 1 else (sample, 0)] = start
            ids.append(drawn)
        labels = (rng.random(GLOBAL_BATCH) < 0.4).astype(np.float32)
        batches.append((numerical, ids, labels))
    return batches


def rank_view(batch, placement, ctx):
    """This rank's inputs as the data loader hands them: its slice of numerical/labels, global ids of its tables."""
    numerical, ids, labels = batch
    b = GLOBAL_BATCH // ctx.world_size
    rows = slice(ctx.rank * b, (ctx.rank + 1) * b)
    categorical = tuple(tf.constant(ids[t] if is_global else ids[t][rows])
                        for t, is_global in placement.input_tables(ctx.rank))
    return tf.constant(numerical[rows]), categorical, tf.constant(labels[rows])


def train(config, ctx, batches, eval_batch):
    config = dict(config)
    xla = config.pop("xla", False)
    optimizer_name = config.pop("optimizer", "sgd")
    table_sizes = LARGE_TABLE_SIZES if config.pop("large", False) else TABLE_SIZES
    placement = plan_placement(table_sizes, DIMS, ctx.world_size, **config)
    sparse = SparseModel(table_sizes, DIMS, HOTNESS, placement, ctx, seed=SEED)
    # Different initial dense weights on each rank: the broadcast must make them rank 0's.
    dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotNormal(seed=5 + ctx.rank))
    dense.build((None, 3 + sum(DIMS)))
    variables = sparse.trainable_variables + dense.trainable_variables
    broadcast_replicated_variables(variables, sparse.model_parallel_variables)
    num_tables = len(sparse.trainable_variables)
    dense_optimizer, embedding_optimizer = create_optimizers(optimizer_name, 0.5 if optimizer_name == "sgd" else 0.02)

    def forward(numerical, categorical):
        return dense(tf.concat([numerical] + sparse(categorical), axis=1))

    def step(numerical, categorical, labels):
        with tf.GradientTape() as tape:
            logits = forward(numerical, categorical)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels[:, None], logits))
        grads = tape.gradient(loss, variables)
        grads = reduce_gradients(grads, variables, sparse.model_parallel_variables, ctx)
        embedding_optimizer.apply_gradients(zip(grads[:num_tables], variables[:num_tables]))
        dense_optimizer.apply_gradients(zip(grads[num_tables:], variables[num_tables:]))
        return hvd_utils.allreduce(loss, average=True)

    step = hvd_utils.compile_step(step, xla)
    losses, untouched_moved = [], {}
    for batch in batches:
        before = [var.numpy() for _, var in sparse.shard_variables] if table_sizes is LARGE_TABLE_SIZES else None
        losses.append(float(step(*rank_view(batch, placement, ctx)).numpy()))
        if before is not None:
            _untouched_change(sparse, before, batch, untouched_moved)
    numerical, categorical, _ = rank_view(eval_batch, placement, ctx)
    logits = hvd_utils.allgather(forward(numerical, categorical))
    result = {"losses": losses, "logits": logits.numpy().ravel().tolist(),
              "placement": placement.describe(),
              "gradient_types": sorted({type(g).__name__ for g in tf.nest.flatten(
                  _gradient_types(forward, variables, eval_batch, placement, ctx))})}
    if table_sizes is LARGE_TABLE_SIZES:
        result["untouched_max_change"] = untouched_moved
        result["shards"] = [{"table": shard.table, "rows": list(shard.rows), "cols": list(shard.cols),
                             "values": var.numpy().tolist()} for shard, var in sparse.shard_variables]
    return result


def _untouched_change(sparse, before, batch, moved):
    """Update ``moved[table]`` with the largest change, in this step, of a row of this rank that the step's global
    batch did not look up (lazy Adam: exactly 0)."""
    _, ids, _ = batch
    for (shard, var), old in zip(sparse.shard_variables, before):
        looked_up = {int(i) for i in np.ravel(ids[shard.table]) if i >= 0}
        rows = [r - shard.rows[0] for r in range(*shard.rows) if r not in looked_up]
        change = float(np.max(np.abs(var.numpy()[rows] - old[rows]))) if rows else 0.0
        moved[str(shard.table)] = max(moved.get(str(shard.table), 0.0), change)


def _gradient_types(forward, variables, batch, placement, ctx):
    numerical, categorical, labels = rank_view(batch, placement, ctx)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(forward(numerical, categorical))
    return tape.gradient(loss, variables[:len(variables) - 2])  # the embedding variables only


def main(argv):
    out_dir = argv[0]
    only = argv[1].split(",") if len(argv) > 1 else list(CONFIGS)
    ctx = hvd_utils.init()
    try:
        batches = global_batches(np.random.default_rng(2024), STEPS + 1)
        large_batches = global_batches(np.random.default_rng(2025), STEPS + 1, LARGE_TABLE_SIZES,
                                       slice_starts_once=True)
        results = {"rank": ctx.rank, "world_size": ctx.world_size}
        for name in only:
            data = large_batches if name in LARGE_CONFIGS else batches
            results[name] = train(CONFIGS[name], ctx, data[:STEPS], data[STEPS])
        with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        hvd_utils.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
