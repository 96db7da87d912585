"""NVIDIA's DLRM/DCNv2 learning-rate schedule: linear warmup, constant, polynomial (power 2) decay to 0.

With ``s`` = the number of optimizer updates already applied (Keras' ``optimizer.iterations``; 0 for the first step),
``W = warmup_steps``, ``S = decay_start_step``, ``D = decay_steps``:

    s < W                 lr = base_lr * s / W                       (linear warmup from 0: the first step has lr 0)
    W <= s < S            lr = base_lr                               (constant)
    S <= s < S + D        lr = base_lr * ((S + D - s) / D) ** 2      (polynomial decay, power 2)
    s >= S + D            lr = 0

These are the semantics of NVIDIA's TF2 ``nn/lr_scheduler.py`` (its step counter is incremented after each
update, and warmup is tested first, so a warmup longer than ``S`` wins), with two deliberate differences:
NVIDIA's formula keeps squaring ``(S + D - s) / D`` after the end of the decay, so its rate grows again past
``S + D``; ours stays 0 there. ``D = 0`` means no decay phase (constant after warmup) instead of a division by
zero; ``W = 0`` means no warmup. The same schedule drives both optimizers (each steps once per training step).

``WarmupPolyDecay(base_lr, warmup_steps, decay_start_step, decay_steps)`` is a Keras ``LearningRateSchedule``
(graph/XLA friendly: ``tf.where`` only); ``learning_rate_at(step, ...)`` is its pure-python twin for tests and logs.
"""
from __future__ import annotations

import tensorflow as tf

POLY_POWER = 2


def _check(base_lr: float, warmup_steps: int, decay_start_step: int, decay_steps: int) -> None:
    if warmup_steps < 0:
        raise ValueError(f"--warmup_steps must be >= 0, got {warmup_steps}")
    if decay_start_step < 0:
        raise ValueError(f"--decay_start_step must be >= 0, got {decay_start_step}")
    if decay_steps < 0:
        raise ValueError(f"--decay_steps must be >= 0, got {decay_steps}")
    if not base_lr > 0:
        raise ValueError(f"--learning_rate must be positive, got {base_lr}")


def learning_rate_at(step: int, base_lr: float, warmup_steps: int, decay_start_step: int, decay_steps: int) -> float:
    """The rate for the update after ``step`` updates (pure python, same rule as ``WarmupPolyDecay``)."""
    _check(base_lr, warmup_steps, decay_start_step, decay_steps)
    if step < warmup_steps:
        return base_lr * step / warmup_steps
    if decay_steps == 0 or step < decay_start_step:
        return base_lr
    if step >= decay_start_step + decay_steps:
        return 0.0
    return base_lr * ((decay_start_step + decay_steps - step) / decay_steps) ** POLY_POWER


class WarmupPolyDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Keras schedule: ``schedule(step) -> float32 rate`` (see the module docstring for the rule)."""

    def __init__(self, base_lr: float, warmup_steps: int, decay_start_step: int, decay_steps: int):
        _check(base_lr, warmup_steps, decay_start_step, decay_steps)
        self.base_lr = float(base_lr)
        self.warmup_steps = int(warmup_steps)
        self.decay_start_step = int(decay_start_step)
        self.decay_steps = int(decay_steps)

    def learning_rate_at(self, step: int) -> float:
        return learning_rate_at(step, self.base_lr, self.warmup_steps, self.decay_start_step, self.decay_steps)

    def __call__(self, step):
        with tf.name_scope("warmup_poly_decay"):
            # float64 for the step arithmetic: exact for any step count; the rate is returned float32.
            s = tf.cast(step, tf.float64)
            base = tf.constant(self.base_lr, tf.float64)
            rate = base
            if self.decay_steps > 0:
                end = float(self.decay_start_step + self.decay_steps)
                remaining = tf.maximum(end - s, 0.0) / float(self.decay_steps)
                rate = tf.where(s < float(self.decay_start_step), base, base * remaining ** POLY_POWER)
            if self.warmup_steps > 0:
                rate = tf.where(s < float(self.warmup_steps), base * s / float(self.warmup_steps), rate)
            return tf.cast(rate, tf.float32)

    def get_config(self):
        return {"base_lr": self.base_lr, "warmup_steps": self.warmup_steps,
                "decay_start_step": self.decay_start_step, "decay_steps": self.decay_steps}
