"""A tiny hybrid-parallel training run with periodic checkpoints, for the crash/resume tests (one rank or horovodrun).

    python checkpoint_worker.py OUT --steps 40 [--every 10] [--save ROOT] [--restore PATH] [--optimizer sgd|adam]
                                [--step_delay S] [--row_slice_threshold N]

Tables of a few dozen rows, placed by the recipe's planner over the ranks (``dlrm_dcnv2.distributed.placement``),
the recipe's ``SparseModel`` and gradient rule, a two-layer dense part, and ``utils.checkpointing``. Global batch
``i`` is drawn from a generator seeded by ``i`` alone, so a resumed run (starting at the checkpoint's global step)
sees the batches an uninterrupted run would. Writes, per rank, ``OUT/rank<r>.json``: every step's loss (this rank's
local mean, as ``float.hex`` so that comparisons are exact), the step it started from, the final evaluation's
exact AUC and predictions (gathered over ranks), and the dense weights (rank 0).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(os.path.dirname(HERE)), "..", "common")]
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

from dlrm_dcnv2.distributed import hvd_utils  # noqa: E402
from dlrm_dcnv2.distributed.gradients import reduce_gradients  # noqa: E402
from dlrm_dcnv2.distributed.placement import plan_placement  # noqa: E402
from dlrm_dcnv2.nn.sparse_model import SparseModel  # noqa: E402
from dlrm_dcnv2.utils import checkpointing  # noqa: E402

TABLES = [60, 37, 25, 11]
DIM = 4
NUMERICAL = 3
GLOBAL_BATCH = 32
EVAL_ROWS = 256


def global_batch(index, rows=GLOBAL_BATCH):
    """Batch ``index`` of the whole job: numerical [B, 3], ids [B] per table, labels [B] (learnable)."""
    rng = np.random.default_rng([17, index])
    numerical = rng.standard_normal((rows, NUMERICAL)).astype(np.float32)
    ids = [rng.integers(0, n, rows).astype(np.int32) for n in TABLES]
    logit = numerical[:, 0] + 0.8 * np.sin(ids[0].astype(np.float32)) - 0.5 * (ids[1] % 3 == 0)
    labels = (rng.random(rows) < 1 / (1 + np.exp(-2 * logit))).astype(np.float32)
    return numerical, ids, labels


def local_batch(batch, sparse, ctx):
    """This rank's inputs: its slice of numericals/labels, whole-batch ids of its model-parallel tables."""
    numerical, ids, labels = batch
    b = len(labels) // ctx.world_size
    rows = slice(ctx.rank * b, (ctx.rank + 1) * b)
    categorical = tuple(tf.constant(ids[t] if whole else ids[t][rows]) for t, whole in sparse.input_tables)
    return tf.constant(numerical[rows]), categorical, tf.constant(labels[rows])


class Model:
    def __init__(self, ctx, placement):
        self.sparse = SparseModel(TABLES, DIM, 1, placement, ctx, seed=5)
        self.dense = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)])
        self.dense.build((None, NUMERICAL + DIM * len(TABLES)))
        tf.keras.utils.set_random_seed(3)  # the same dense init on every rank and every run
        for w in self.dense.weights:
            w.assign(tf.random.stateless_uniform(w.shape, seed=(1, len(w.name)), minval=-0.3, maxval=0.3))

    def __call__(self, numerical, categorical):
        return self.dense(tf.concat([numerical] + self.sparse(categorical), axis=1))


def create_optimizers(name):
    """SGD (one optimizer for everything), or the recipe's Keras Adam for the MLPs + LazyAdam for the tables."""
    if name == "sgd":
        opt = tf.keras.optimizers.legacy.SGD(0.5)
        return opt, opt
    from dlrm_dcnv2.nn.optimizers import create_optimizers as recipe_optimizers
    return recipe_optimizers(name, 0.05)


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=None)
    p.add_argument("--save", default=None)
    p.add_argument("--restore", default=None)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--step_delay", type=float, default=0.0)
    p.add_argument("--row_slice_threshold", type=float, default=None)
    args = p.parse_args(argv)
    ctx = hvd_utils.init()
    try:
        placement = plan_placement(TABLES, DIM, ctx.world_size, row_slice_threshold=args.row_slice_threshold)
        model = Model(ctx, placement)
        dense_opt, emb_opt = create_optimizers(args.optimizer)
        table_vars = [v for _, v in model.sparse.shard_variables]
        dense_vars = model.dense.trainable_variables

        @tf.function
        def train_step(numerical, categorical, labels):
            with tf.GradientTape() as tape:
                logits = tf.squeeze(model(numerical, categorical), 1)
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
            grads = tape.gradient(loss, dense_vars + table_vars)
            grads = reduce_gradients(grads, dense_vars + table_vars, model.sparse.model_parallel_variables, ctx)
            if dense_opt is emb_opt:
                dense_opt.apply_gradients(zip(grads, dense_vars + table_vars))
            else:
                dense_opt.apply_gradients(zip(grads[:len(dense_vars)], dense_vars))
                emb_opt.apply_gradients(zip(grads[len(dense_vars):], table_vars))
            return loss

        start = 0
        if args.restore:
            state = checkpointing.restore_checkpoint(args.restore, model, (dense_opt, emb_opt), ctx,
                                                     config={"model": "worker", "table_sizes": TABLES})
            start = state["global_step"]
        manager = None
        if args.save:
            manager = checkpointing.CheckpointManager(args.save, model, (dense_opt, emb_opt), ctx,
                                                      {"model": "worker", "table_sizes": TABLES},
                                                      every_steps=args.every, keep=2, resumed_from=args.restore)
        losses = {}
        for step in range(start + 1, args.steps + 1):
            loss = train_step(*local_batch(global_batch(step - 1), model.sparse, ctx))
            losses[step] = float(loss.numpy()).hex()
            if manager is not None:
                manager.maybe_save(step, epoch=0, batch_in_epoch=step)
                if manager.last_step is not None and args.step_delay:
                    time.sleep(args.step_delay)  # gives the kill test time to strike after the first checkpoint
        if manager is not None:
            manager.save(args.steps, epoch=0, batch_in_epoch=args.steps)

        numerical, ids, labels = global_batch(10 ** 6, EVAL_ROWS)
        logits = model(*local_batch((numerical, ids, labels), model.sparse, ctx)[:2])
        scores = hvd_utils.allgather(tf.reshape(logits, [-1])).numpy()
        from sklearn.metrics import roc_auc_score
        result = {"rank": ctx.rank, "world_size": ctx.world_size, "start": start, "losses": losses,
                  "auc": float(roc_auc_score(labels, scores)), "scores": scores.tolist(),
                  "dense": [w.numpy().tolist() for w in model.dense.weights] if ctx.rank == 0 else None}
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{ctx.rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        hvd_utils.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
