"""Horovod + TensorFlow worker, started by `horovodrun -np 2 -H localhost:2 --gloo`.

Checks collective results and that hvd.DistributedOptimizer keeps tf-keras (Keras 2) weights in
sync when each rank trains on different data. Writes <out_dir>/rank<r>.json.
Usage: hvd_tf_worker.py <out_dir>
"""
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
result = {"rank": rank, "size": size, "keras_module": tf.keras.Model.__module__}

# 1. allreduce: rank r contributes [r+1, 10(r+1)]
x = tf.constant([rank + 1.0, 10.0 * (rank + 1)])
result["allreduce_sum"] = hvd.allreduce(x, op=hvd.Sum).numpy().tolist()
result["allreduce_avg"] = hvd.allreduce(x, op=hvd.Average).numpy().tolist()
result["allgather"] = hvd.allgather(tf.constant([[float(rank)]])).numpy().ravel().tolist()

# 2. DistributedOptimizer with model.fit: different initial weights and different data on each
#    rank; the broadcast callback makes the start equal, averaged gradients must keep it equal.
tf.keras.utils.set_random_seed(100 + rank)
model = tf.keras.Sequential([
    tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
    tf.keras.layers.Dense(1),
])
rng = np.random.default_rng(rank)
features = rng.normal(size=(64, 4)).astype("float32")
labels = (features @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32"))[:, None] + rank
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=0.05))
model.compile(optimizer=opt, loss="mse")
initial = [w.copy() for w in model.get_weights()]
history = model.fit(features, labels, batch_size=16, epochs=2, shuffle=False, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
final = model.get_weights()
result["weights"] = np.concatenate([w.ravel() for w in final]).tolist()
result["initial_weights"] = np.concatenate([w.ravel() for w in initial]).tolist()
result["loss"] = [float(v) for v in history.history["loss"]]

with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
