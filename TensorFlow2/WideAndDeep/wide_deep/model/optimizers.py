"""The two optimizers of Wide & Deep and its one training step (training, ``--benchmark`` and the benchmarks).

FTRL for the wide part, RMSprop (rho 0.5, updates XLA-compiled: :func:`compiled_rmsprop`) for the deep part, each
wrapped in a dynamic loss scaler under float16 AMP (:func:`create_optimizers`); :func:`make_train_step` is forward +
backward, the Horovod allreduce, both updates. The deep learning rate's schedule is :mod:`wide_deep.model.schedule`.
"""
from __future__ import annotations

import tensorflow as tf


def compiled_rmsprop(learning_rate: float, rho: float):
    """Keras' legacy RMSprop (no momentum, not centered) whose updates are XLA-compiled, one program per variable.

    The same arithmetic as ``tf.keras.optimizers.legacy.RMSprop``:
    :math:`s \\leftarrow \\rho s + (1 - \\rho) g^2`, :math:`w \\leftarrow w - \\eta g / (\\sqrt{s} + \\epsilon)`;
    for an embedding table's sparse gradient, as Keras does it: the duplicate rows summed, the whole ``s`` decayed
    by ``rho``, then the rows' :math:`(1 - \\rho) g^2` added and the rows of ``w`` updated. Keras writes this as a
    chain of element-wise TensorFlow ops, each a pass over the variable (over every row of every table for the
    decay), which with the variable reads and writes took 25 % of a bfloat16 W&D step on a 2-core AMD EPYC (profile
    of 2026-11-25); XLA fuses each chain into one read and one write. A sparse gradient is passed with its rows
    summed and padded to the length of the gradient as it came (zero rows at index 0, which change nothing), so
    that the program has one shape and compiles once; gradients of unknown length take Keras' own path.
    """
    @tf.function(jit_compile=True)
    def dense_update(var, rms, grad, lr, rho_, one_minus_rho, epsilon):
        rms_t = rho_ * rms + one_minus_rho * tf.square(grad)
        rms.assign(rms_t)
        var.assign(var - lr * grad / (tf.sqrt(rms_t) + epsilon))
        return tf.constant(True)   # an output for apply_gradients to group on

    @tf.function(jit_compile=True)
    def sparse_update(var, rms, values, indices, neg_lr, rho_, one_minus_rho, epsilon):
        rms.assign(rms * rho_)
        rms.scatter_add(tf.IndexedSlices((values * values) * one_minus_rho, indices))
        rms_rows = tf.gather(rms, indices)
        var.scatter_add(tf.IndexedSlices(neg_lr * values / (tf.sqrt(rms_rows) + epsilon), indices))
        return tf.constant(True)

    class CompiledRMSprop(tf.keras.optimizers.legacy.RMSprop):
        def _coefficients(self, var, apply_state):
            key = (var.device, var.dtype.base_dtype)
            return (apply_state or {}).get(key) or self._fallback_apply_state(*key)

        def _resource_apply_dense(self, grad, var, apply_state=None):
            if self._momentum or self.centered:
                return super()._resource_apply_dense(grad, var, apply_state)
            c = self._coefficients(var, apply_state)
            return dense_update(var, self.get_slot(var, "rms"), grad, c["lr_t"], c["rho"], c["one_minus_rho"],
                                c["epsilon"])

        def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices, **kwargs):
            length = indices.shape[0]
            if self._momentum or self.centered or length is None:
                return super()._resource_apply_sparse_duplicate_indices(grad, handle, indices, **kwargs)
            unique, positions = tf.unique(indices)
            summed = tf.math.unsorted_segment_sum(grad, positions, length)      # rows past the unique ones: 0
            padded = tf.scatter_nd(tf.range(tf.size(unique))[:, None], unique, [length])   # ... at index 0
            c = self._coefficients(handle, kwargs.get("apply_state"))
            return sparse_update(handle, self.get_slot(handle, "rms"), summed, padded, c["neg_lr_t"], c["rho"],
                                 c["one_minus_rho"], c["epsilon"])

    return CompiledRMSprop(learning_rate=learning_rate, rho=rho)


def create_optimizers(model, linear_learning_rate: float, deep_learning_rate: float, loss_scale: bool):
    """``(wide_opt, deep_opt)``: FTRL for the wide part, RMSprop (rho 0.5; dense updates compiled, see
    ``compiled_rmsprop``) for the deep part, slots created.

    The legacy (optimizer v2) classes, as NVIDIA's TF 2.8 recipe used: FTRL's sparse kernel updates only the rows a
    batch touched; RMSprop (without momentum) decays every row's ``s`` of every table at each step and updates the
    touched rows' weights, in Keras' arithmetic whether compiled or not. ``loss_scale`` wraps
    each of them in a dynamic LossScaleOptimizer (float16 on GPU), as NVIDIA's recipe: each part's gradients come
    from the loss scaled by its own optimizer, and a step whose gradients overflowed is skipped (and that scale
    halved) by the part it overflowed in. Wrapping only the deep one left FTRL to apply inf/NaN gradients.
    """
    wide_opt = tf.keras.optimizers.legacy.Ftrl(learning_rate=linear_learning_rate)
    deep_opt = compiled_rmsprop(deep_learning_rate, rho=0.5)
    if loss_scale:
        wide_opt = tf.keras.mixed_precision.LossScaleOptimizer(wide_opt)
        deep_opt = tf.keras.mixed_precision.LossScaleOptimizer(deep_opt)
    # Slots exist before a restore or the first step (also what a traced apply step needs).
    (wide_opt.inner_optimizer if loss_scale else wide_opt)._create_all_weights(model.wide.trainable_variables)
    (deep_opt.inner_optimizer if loss_scale else deep_opt)._create_all_weights(model.deep.trainable_variables)
    return wide_opt, deep_opt


def make_train_step(model, wide_opt, deep_opt, *, xla: bool, loss_scale: bool, allreduce_grads=None,
                    step_var=None):
    """The one training step (training and the benchmark): ``step(features, labels, deep_lr) -> loss``.

    Forward + backward under ``tf.function(jit_compile=xla)``; then ``allreduce_grads`` (Horovod; identity when None),
    the deep learning rate set, FTRL on the wide variables, RMSprop on the deep ones, ``step_var`` incremented.
    """
    wide_vars, deep_vars = model.wide.trainable_variables, model.deep.trainable_variables
    all_vars = wide_vars + deep_vars
    n_wide = len(wide_vars)

    def grads_fn(features, labels):
        with tf.GradientTape(persistent=loss_scale) as tape:
            logits = model(features, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
            if loss_scale:  # one scaled loss per part, each with its own optimizer's dynamic scale
                wide_loss, deep_loss = wide_opt.get_scaled_loss(loss), deep_opt.get_scaled_loss(loss)
        if not loss_scale:
            return loss, tape.gradient(loss, all_vars)
        wide_grads = wide_opt.get_unscaled_gradients(tape.gradient(wide_loss, wide_vars))
        deep_grads = deep_opt.get_unscaled_gradients(tape.gradient(deep_loss, deep_vars))
        del tape
        return loss, list(wide_grads) + list(deep_grads)
    # XLA compiles the forward and backward pass; Horovod's collectives and the sparse updates stay outside it.
    grads_fn = tf.function(grads_fn, jit_compile=xla or None)

    @tf.function
    def apply_fn(grads, deep_lr):
        if allreduce_grads is not None:
            grads = allreduce_grads(grads)
        (deep_opt.inner_optimizer if loss_scale else deep_opt).learning_rate.assign(deep_lr)
        wide_opt.apply_gradients(zip(grads[:n_wide], wide_vars))
        deep_opt.apply_gradients(zip(grads[n_wide:], deep_vars))
        if step_var is not None:
            step_var.assign_add(1)

    def step(features, labels, deep_lr):
        loss, grads = grads_fn(features, labels)
        apply_fn(grads, deep_lr)
        return loss
    return step
