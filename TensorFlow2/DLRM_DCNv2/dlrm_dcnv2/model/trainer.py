"""One training step of DLRM / DCNv2: forward, loss, gradients, the hybrid-parallel gradient rule, two optimizers.

``Trainer(model, dense_optimizer, embedding_optimizer, ctx, loss_scale, xla)``; ``train_step(numerical,
categorical, labels) -> loss`` (a float32 scalar: the mean binary cross-entropy over the GLOBAL batch, i.e. the
mean of every rank's local loss, so every rank sees the same value and a NaN stops all of them at the same step)::

    logits = model((numerical, categorical), training=True)            [b, 1] float32
    loss   = mean(BCE(labels, logits))                                 this rank's b rows
    grads  = d(loss * S)/d(vars) / S                                   S = --loss_scale under mixed_float16, else 1
    grads  = reduce_gradients(grads, ...)                              model-parallel shards: / N; others: allreduce
    dense_optimizer.apply(MLP grads); embedding_optimizer.apply(table grads)

Loss scaling is static (NVIDIA: ``LossScaleOptimizer(dynamic=False, initial_scale=65536)``): float16 gradients
of small losses underflow without it; bfloat16 (CPU AMP) has float32's exponent range and needs none. The
embedding gradients are unscaled the same way, and the tables stay float32 (the sparse model is float32 whatever the
policy), which is the reference's "embeddings are not run in FP16".

``xla``: the step is compiled by ``hvd_utils.compile_step`` (``jit_compile=True`` on one rank; XLA auto-clustering
around the Horovod collectives on several), so ``--xla`` takes effect however the program was started.

On a CPU the embedding optimizer's update is compiled by XLA even when the step is not (``compile_embedding_update``,
on by default where TensorFlow sees no GPU, unless the whole step already is): TensorFlow's CPU kernels add a sparse gradient row by row (``ResourceScatterAdd``,
one thread, an Eigen expression per row), which was about a quarter of the CPU time of a Kaggle-shape DLRM step
(26 tables x 2048 rows of 16 floats: 12 CPU-ms against 2.4 in XLA's fused loop; issue 18 profile in the README).
XLA updates the tables in place (TensorFlow aliases a variable's buffer to the compiled update's output), and the
result is the same update: ``tests/test_train_step.py`` compares the weights with and without it, SGD and lazy Adam.
The rest of the step stays with TensorFlow's oneDNN kernels unless ``--xla``: XLA's CPU GEMMs were slower there.
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from dlrm_dcnv2.distributed import hvd_utils
from dlrm_dcnv2.distributed.gradients import reduce_gradients


def bce_from_logits(labels, logits):
    """Mean binary cross-entropy of float32 ``logits`` ``[b, 1]`` (or ``[b]``) against 0/1 ``labels`` ``[b]``."""
    logits = tf.reshape(tf.cast(logits, tf.float32), [-1])
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1])
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def _scale(grad, factor):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


class Trainer:
    """Owns the compiled training step of ``model`` (a ``RecModel``) on this rank.

    ``dense_optimizer`` updates ``model.dense_variables``, ``embedding_optimizer`` ``model.embedding_variables``
    (the same object may be passed twice: one optimizer for everything); ``ctx``: ``hvd_utils.Context``;
    ``loss_scale``: static loss scale (None or 1: none); ``run_eagerly``: no ``tf.function`` (debugging);
    ``compile_embedding_update``: the embedding optimizer's update as one XLA program (see the module docstring;
    ignored when the step is eager or compiled whole, or when one optimizer updates everything); ``None``: where
    TensorFlow sees no GPU.
    """

    def __init__(self, model, dense_optimizer, embedding_optimizer, ctx: Optional[hvd_utils.Context] = None,
                 loss_scale: Optional[float] = None, xla: bool = False, run_eagerly: bool = False,
                 compile_embedding_update: Optional[bool] = None):
        self.model = model
        self.dense_optimizer = dense_optimizer
        self.embedding_optimizer = embedding_optimizer
        self.ctx = ctx if ctx is not None else hvd_utils.context()
        self.loss_scale = float(loss_scale) if loss_scale and loss_scale != 1 else None
        if compile_embedding_update is None:
            # CPU only by default: it was measured there, GPU scatter kernels are parallel already, and one XLA
            # program cannot update a table kept on the host (--cpu_offloading_threshold_gb) from a GPU step.
            compile_embedding_update = not tf.config.list_logical_devices("GPU")
        self._embedding_update = None
        if compile_embedding_update and not (run_eagerly or xla or dense_optimizer is embedding_optimizer):
            self._embedding_update = tf.function(self._apply_embeddings, jit_compile=True)
        self._step = self._train_step if run_eagerly else hvd_utils.compile_step(self._train_step, xla)

    @property
    def jit_compiled(self) -> bool:
        """Whether the step is one XLA program (``tf.function(jit_compile=True)``)."""
        return bool(getattr(self._step, "_jit_compile", False))

    @property
    def embedding_update_compiled(self) -> bool:
        """Whether the embedding update is XLA-compiled on its own (inside a step that is not)."""
        return self._embedding_update is not None

    def train_step(self, numerical, categorical, labels):
        """One update on this rank's batch; returns the global-batch mean loss (float32 scalar tensor)."""
        return self._step(numerical, tuple(categorical), labels)

    def _train_step(self, numerical, categorical, labels):
        dense_vars = list(self.model.dense_variables)
        embedding_vars = list(self.model.embedding_variables)
        with tf.GradientTape() as tape:
            logits = self.model((numerical, categorical), training=True)
            loss = bce_from_logits(labels, logits)
            objective = loss * self.loss_scale if self.loss_scale else loss
        variables = dense_vars + embedding_vars
        grads = tape.gradient(objective, variables)
        if self.loss_scale:
            grads = [_scale(g, 1.0 / self.loss_scale) for g in grads]
        grads = reduce_gradients(grads, variables, self.model.sparse.model_parallel_variables, self.ctx)
        n = len(dense_vars)
        if self.dense_optimizer is self.embedding_optimizer:
            self._apply(self.dense_optimizer, grads, variables)
        else:
            self._apply(self.dense_optimizer, grads[:n], dense_vars)
            if self._embedding_update is not None and any(g is not None for g in grads[n:]):
                self._embedding_update(grads[n:])
            else:
                self._apply(self.embedding_optimizer, grads[n:], embedding_vars)
        return hvd_utils.allreduce(loss, average=True, name="train_loss")

    def _apply_embeddings(self, grads):
        self._apply(self.embedding_optimizer, grads, list(self.model.embedding_variables))

    @staticmethod
    def _apply(optimizer, grads, variables):
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        if pairs:
            optimizer.apply_gradients(pairs)
