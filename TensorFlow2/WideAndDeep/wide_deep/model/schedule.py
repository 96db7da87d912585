"""Learning-rate schedule of the deep part (reference A.2): linear warm-up, then two constant steps.

    step < warmup_steps:            base_lr * (step + 1) / warmup_steps
    warmup_steps <= step < bound:   base_lr / 4
    step >= bound:                  base_lr / 8
    bound = (warmup_epochs + (num_epochs - warmup_epochs) / 2) * steps_per_epoch

The wide part's FTRL rate is constant.
"""
from __future__ import annotations


class DeepLearningRateSchedule:
    """Callable ``step -> learning rate`` (Python floats; ``step`` counts optimizer steps from 0)."""

    def __init__(self, base_lr: float, warmup_epochs: float, num_epochs: int, steps_per_epoch: int):
        if warmup_epochs > num_epochs:
            raise ValueError(f"--deep_warmup_epochs ({warmup_epochs}) cannot be more than --num_epochs ({num_epochs})")
        if warmup_epochs < 0:
            raise ValueError(f"--deep_warmup_epochs must be >= 0, got {warmup_epochs}")
        self.base_lr = float(base_lr)
        self.warmup_steps = int(round(warmup_epochs * steps_per_epoch))
        self.bound = (warmup_epochs + (num_epochs - warmup_epochs) / 2.0) * steps_per_epoch

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        if step < self.bound:
            return self.base_lr / 4.0
        return self.base_lr / 8.0
