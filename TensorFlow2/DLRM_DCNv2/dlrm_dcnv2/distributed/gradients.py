"""The hybrid-parallel gradient rule, in one place (called by the trainer after ``tape.gradient``).

Each rank's loss is the mean over its local batch slice of ``b = B / N`` rows, so the one-rank loss over the
global batch is the mean of the N ranks' losses, and its gradient the mean of theirs:

* a **model-parallel** shard lives on one rank; the all-to-all's backward pass already brought every rank's
  gradient for it there and summed them, so the mean is that sum divided by N; it is NOT allreduced
  (other ranks hold other shards);
* every **other** trainable variable (MLPs, data-parallel tables) is replicated, and the mean over ranks is
  ``hvd.allreduce(average)`` (allgathered, not densified, for a table's ``tf.IndexedSlices``).

With one rank both are the identity. Usage::

    grads = tape.gradient(loss, variables)
    grads = reduce_gradients(grads, variables, model.sparse.model_parallel_variables, ctx)
"""
from __future__ import annotations

import re
from typing import Iterable, List, Optional, Sequence

import tensorflow as tf

from dlrm_dcnv2.distributed import hvd_utils


def _scale(grad, factor: float):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def reduce_gradients(grads: Sequence, variables: Sequence[tf.Variable],
                     model_parallel_variables: Iterable[tf.Variable], ctx: hvd_utils.Context) -> List:
    """Gradients of ``variables`` (same order) as the one-rank run over the global batch would have them.

    ``grads``: from ``tape.gradient`` (``None`` stays ``None``: a variable the loss does not reach).
    """
    if len(grads) != len(variables):
        raise ValueError(f"{len(grads)} gradients for {len(variables)} variables")
    if ctx.world_size == 1:
        return list(grads)
    model_parallel = {v.ref() for v in model_parallel_variables}
    reduced: List[Optional[tf.Tensor]] = []
    replicated = 0
    for grad, var in zip(grads, variables):
        if var.ref() in model_parallel:
            reduced.append(None if grad is None else _scale(grad, 1.0 / ctx.world_size))
            continue
        # Horovod pairs the ranks' allreduces by name: the replicated variables come in the same order on every
        # rank (only the model-parallel ones differ), so their position and name identify them everywhere.
        name = f"grad_{replicated}_{re.sub('[^A-Za-z0-9_]', '_', var.name)}"
        replicated += 1
        if grad is None:
            reduced.append(None)
        else:
            reduced.append(hvd_utils.allreduce(grad, average=True, name=name))
    return reduced


def broadcast_replicated_variables(variables: Iterable[tf.Variable],
                                   model_parallel_variables: Iterable[tf.Variable], root: int = 0) -> None:
    """At the start of training: rank ``root``'s values for every replicated variable (MLPs, data-parallel tables).

    Model-parallel shards are skipped: each exists on one rank only, and is already initialised identically to
    the one-rank run (``model.embedding.initial_values``).
    """
    model_parallel = {v.ref() for v in model_parallel_variables}
    hvd_utils.broadcast_variables([v for v in variables if v.ref() not in model_parallel], root=root)
