"""Optimizers of the recipe: ``create_optimizers(name, schedule, beta1, beta2, epsilon)`` and ``LazyAdam``.

As NVIDIA's ``main.py create_optimizers``:

* ``sgd``: Keras' legacy SGD, momentum 0, for the MLPs and for the embeddings (``EmbeddingSGD``, the same with
  the embedding gradients' ``-1`` indices skipped). NVIDIA shares one instance; we return
  two instances with the same schedule so that each one's ``iterations`` (which drives the schedule) advances once
  per training step however the trainer groups its ``apply_gradients`` calls. A sparse gradient (``tf.gather``'s
  ``IndexedSlices``) updates only the looked-up rows: ``var[i] -= lr * sum of the gradients of row i``.
* ``adam``: Keras' legacy Adam for the MLPs, ``LazyAdam`` (ours, the semantics of ``tfa.optimizers.LazyAdam``,
  which NVIDIA uses and which is not installable with TF 2.21) for the embeddings.

Adam, for a row (or any variable) with gradient ``g`` at update ``t = iterations + 1``::

    m <- m + (1 - beta1) (g - m)             (= beta1 m + (1 - beta1) g)
    v <- v + (1 - beta2) (g^2 - v)
    var <- var - lr_t m / (sqrt(v) + epsilon),   lr_t = lr sqrt(1 - beta2^t) / (1 - beta1^t)

(Keras' ``epsilon_hat`` form, the same as ``tf.raw_ops.ResourceApplyAdam``). ``LazyAdam`` applies it, for an
``IndexedSlices`` gradient, to the touched rows only: duplicate indices are summed first, untouched rows of
``var``, ``m`` and ``v`` are not written (their moments do not decay), and the bias correction uses the
optimizer's own ``iterations`` (one per ``apply_gradients`` call). A dense gradient gets the ordinary Adam update.
A negative index (``model.embedding.NO_ROW``: padding, or an id outside this rank's row slice) touches no row.
The deduplication sorts the indices (static shapes: it compiles under XLA, unlike ``tf.unique``).

Checkpoints: ``LazyAdam.slot_variables(var) -> {"m": ..., "v": ...}`` and ``iterations``; ``build(var_list)``
creates the slots before the first step (to restore them).
"""
from __future__ import annotations

from typing import Dict, Tuple, Union

import tensorflow as tf

LearningRate = Union[float, tf.keras.optimizers.schedules.LearningRateSchedule]

OPTIMIZERS = ("sgd", "adam")


def _skip_no_row(grad, indices):
    """``(grad, indices)`` with every negative index (``model.embedding.NO_ROW``) pointed at row 0 with a zero value:
    the scatter then adds exactly 0 there (row 0 keeps its bits)."""
    present = indices >= 0
    shape = tf.concat([tf.shape(present), tf.ones([tf.rank(grad) - 1], tf.int32)], 0)
    return (grad * tf.reshape(tf.cast(present, grad.dtype), shape),
            tf.where(present, indices, tf.zeros_like(indices)))


class EmbeddingSGD(tf.keras.optimizers.legacy.SGD):
    """Keras' legacy SGD (momentum 0) whose sparse update skips the ``-1`` indices of an embedding gradient."""

    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices, **kwargs):
        grad, indices = _skip_no_row(grad, indices)
        return super()._resource_apply_sparse_duplicate_indices(grad, handle, indices, **kwargs)


class LazyAdam(tf.keras.optimizers.legacy.Adam):
    """Adam that updates only the rows of a sparse (``IndexedSlices``) gradient; see the module docstring.

    ``LazyAdam(learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7)``; used like any Keras optimizer.
    """

    def __init__(self, learning_rate: LearningRate = 0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, name: str = "LazyAdam", **kwargs):
        super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                         amsgrad=False, name=name, **kwargs)

    # ---- what checkpoints need ----
    def slot_variables(self, var) -> Dict[str, tf.Variable]:
        """``{"m": first moment, "v": second moment}`` of ``var`` (KeyError before they exist: see ``build``)."""
        return {"m": self.get_slot(var, "m"), "v": self.get_slot(var, "v")}

    def build(self, var_list) -> None:
        """Create ``iterations``, the hyper-parameters and the ``m``/``v`` slots of ``var_list`` now."""
        self._create_all_weights(list(var_list))

    # ---- the lazy update ----
    def _resource_apply_sparse_duplicate_indices(self, grad, var, indices, **kwargs):
        return self._lazy_update(grad, var, indices, kwargs.get("apply_state"))

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        return self._lazy_update(grad, var, indices, apply_state)

    def _lazy_update(self, grad, var, indices, apply_state):
        var_device, var_dtype = var.device, var.dtype.base_dtype
        coefficients = ((apply_state or {}).get((var_device, var_dtype))
                        or self._fallback_apply_state(var_device, var_dtype))
        rows, summed, valid = _sum_duplicates(grad, indices, var_dtype)
        m = self.get_slot(var, "m")
        v = self.get_slot(var, "v")
        m_rows = tf.gather(m, rows)
        v_rows = tf.gather(v, rows)
        # Deltas added with scatter-add: the padding segments of _sum_duplicates point at a real row (0) and add
        # exactly 0 there, so every row but the touched ones keeps its bits.
        m_delta = (summed - m_rows) * coefficients["one_minus_beta_1_t"] * valid
        v_delta = (tf.square(summed) - v_rows) * coefficients["one_minus_beta_2_t"] * valid
        m_new = m_rows + m_delta
        v_new = v_rows + v_delta
        var_delta = -(m_new * coefficients["lr"]) / (tf.sqrt(v_new) + coefficients["epsilon"]) * valid
        return tf.group(
            tf.raw_ops.ResourceScatterAdd(resource=m.handle, indices=rows, updates=m_delta),
            tf.raw_ops.ResourceScatterAdd(resource=v.handle, indices=rows, updates=v_delta),
            tf.raw_ops.ResourceScatterAdd(resource=var.handle, indices=rows, updates=var_delta))


def _sum_duplicates(values, indices, dtype) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(rows [k], summed [k, ...], valid [k, 1...])`` for ``k = len(indices)``: the first ``u`` entries are the
    ``u`` distinct non-negative indices (sorted) with their values summed; the rest are padding (row 0, sum 0,
    valid 0). Negative indices (``NO_ROW``) are no row: they only ever end up in the padding.

    Static shapes only (argsort + cumsum + segment sum), so XLA compiles it."""
    indices = tf.reshape(indices, [-1])
    count = tf.shape(indices)[0]
    no_row = indices < 0
    # Sorted after every real row, the negative indices form one last segment, which is not counted as unique.
    indices = tf.where(no_row, tf.fill(tf.shape(indices), indices.dtype.max), indices)
    order = tf.argsort(indices, stable=True)
    sorted_indices = tf.gather(indices, order)
    sorted_values = tf.gather(values, order)
    starts = tf.concat([tf.ones([1], tf.bool), sorted_indices[1:] != sorted_indices[:-1]], axis=0)[:count]
    segment = tf.cumsum(tf.cast(starts, tf.int32)) - 1
    summed = tf.math.unsorted_segment_sum(sorted_values, segment, count)
    num_unique = tf.reduce_sum(tf.cast(starts, tf.int32)) - tf.cast(tf.reduce_any(no_row), tf.int32)
    is_valid = tf.range(count) < num_unique
    rows = tf.math.unsorted_segment_max(sorted_indices, segment, count)  # empty segments: the dtype's minimum
    rows = tf.where(is_valid, rows, tf.zeros_like(rows))
    valid = tf.reshape(tf.cast(is_valid, dtype), tf.concat([[count], tf.ones([tf.rank(values) - 1], tf.int32)], 0))
    return rows, tf.cast(summed, dtype), valid


def create_optimizers(name: str, schedule: LearningRate, beta1: float = 0.9, beta2: float = 0.999,
                      epsilon: float = 1e-7) -> Tuple[tf.keras.optimizers.legacy.Optimizer,
                                                      tf.keras.optimizers.legacy.Optimizer]:
    """``(dense_optimizer, embedding_optimizer)`` for ``--optimizer name`` (see the module docstring).

    ``schedule``: a rate or a ``LearningRateSchedule`` (``lr_scheduler.WarmupPolyDecay``), shared by both.
    ``beta1``/``beta2``/``epsilon``: Adam's (``--beta1``, ``--beta2``; epsilon is Keras' default 1e-7 as NVIDIA's).
    Loss scaling (AMP) is the trainer's business: NVIDIA scales only the dense optimizer under Adam.
    """
    if name == "sgd":
        return (tf.keras.optimizers.legacy.SGD(learning_rate=schedule, momentum=0.0, name="dense_sgd"),
                EmbeddingSGD(learning_rate=schedule, momentum=0.0, name="embedding_sgd"))
    if name == "adam":
        return (tf.keras.optimizers.legacy.Adam(learning_rate=schedule, beta_1=beta1, beta_2=beta2, epsilon=epsilon,
                                                name="dense_adam"),
                LazyAdam(learning_rate=schedule, beta_1=beta1, beta_2=beta2, epsilon=epsilon,
                         name="embedding_lazy_adam"))
    raise ValueError(f"--optimizer {name!r}: expected one of {', '.join(OPTIMIZERS)}")
