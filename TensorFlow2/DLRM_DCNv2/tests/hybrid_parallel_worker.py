"""Worker of tests/test_distributed.py: trains a tiny model over SparseModel on fixed global batches.

Run as ``python hybrid_parallel_worker.py OUT_DIR`` (one process) or under ``horovodrun -np 2 --gloo``; every
placement configuration below is trained in turn (same process: one start-up for all), each from the same
seeds, on the same global batches. Rank ``r`` writes ``OUT_DIR/rank<r>.json``: per configuration the
global-batch loss of each step (allreduced mean of the ranks' losses) and the final logits of a fixed global
evaluation batch (allgathered in rank order), which must not depend on the number of ranks.

The model (logits = Dense(concat(numerical, embeddings of every table)), SGD) is deliberately minimal: it
exercises exactly this helper's parts (placement, all-to-all forward/backward, gradient rule, broadcast of the
replicated variables); the full DLRM/DCNv2 equality runs through dlrm.py/dcnv2.py in the same test file.
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
from dlrm_dcnv2.nn.sparse_model import SparseModel  # noqa: E402

TABLE_SIZES = [60, 40, 30, 25, 12, 6]
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
}


def global_batches(rng, count):
    batches = []
    for _ in range(count):
        numerical = rng.normal(size=(GLOBAL_BATCH, 3)).astype(np.float32)
        ids = []
        for rows, hot in zip(TABLE_SIZES, HOTNESS):
            if hot == 1:
                ids.append(rng.integers(0, rows, size=GLOBAL_BATCH).astype(np.int32))
            else:
                multi = rng.integers(0, rows, size=(GLOBAL_BATCH, hot)).astype(np.int32)
                multi[rng.random(size=multi.shape) < 0.3] = -1  # padding
                ids.append(multi)
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
    placement = plan_placement(TABLE_SIZES, DIMS, ctx.world_size, **config)
    sparse = SparseModel(TABLE_SIZES, DIMS, HOTNESS, placement, ctx, seed=11)
    # Different initial dense weights on each rank: the broadcast must make them rank 0's.
    dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotNormal(seed=5 + ctx.rank))
    dense.build((None, 3 + sum(DIMS)))
    variables = sparse.trainable_variables + dense.trainable_variables
    broadcast_replicated_variables(variables, sparse.model_parallel_variables)
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.5)

    def forward(numerical, categorical):
        return dense(tf.concat([numerical] + sparse(categorical), axis=1))

    def step(numerical, categorical, labels):
        with tf.GradientTape() as tape:
            logits = forward(numerical, categorical)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels[:, None], logits))
        grads = tape.gradient(loss, variables)
        grads = reduce_gradients(grads, variables, sparse.model_parallel_variables, ctx)
        optimizer.apply_gradients(zip(grads, variables))
        return hvd_utils.allreduce(loss, average=True)

    step = hvd_utils.compile_step(step, xla)
    losses = [float(step(*rank_view(batch, placement, ctx)).numpy()) for batch in batches]
    numerical, categorical, _ = rank_view(eval_batch, placement, ctx)
    logits = hvd_utils.allgather(forward(numerical, categorical))
    return {"losses": losses, "logits": logits.numpy().ravel().tolist(),
            "placement": placement.describe(),
            "gradient_types": sorted({type(g).__name__ for g in tf.nest.flatten(
                _gradient_types(forward, variables, eval_batch, placement, ctx))})}


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
        rng = np.random.default_rng(2024)
        batches = global_batches(rng, STEPS + 1)
        results = {"rank": ctx.rank, "world_size": ctx.world_size}
        for name in only:
            results[name] = train(CONFIGS[name], ctx, batches[:STEPS], batches[STEPS])
        with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        hvd_utils.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
