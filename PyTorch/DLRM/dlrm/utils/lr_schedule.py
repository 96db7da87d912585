"""The DLRM learning-rate schedule: linear warmup, constant, polynomial decay (NVIDIA's, reference A.4).

With base rate ``lr``, optimisation steps counted from 1 (the first update is step 1) and
``W = warmup_steps``, ``S = decay_start_step`` (``None``: ``= W``), ``D = decay_steps``, ``p = decay_power``,
``f = warmup_factor``:

    step <= W            lr * (1 - (W - step) / (W * 2**f))      linear warmup; f = 0 starts near 0, f = 1 at lr/2
    W < step <= S        lr                                      constant
    S < step <= S + D    max(lr * ((S + D - step) / D) ** p, end_lr)   polynomial decay (D = 0: no decay)
    step > S + D         end_lr

The seed's log shows ``lr: 0.8794`` at iteration 200 with ``--lr 28 --warmup_steps 6400``: the update after 200
completed steps is step 201, ``28 * 201 / 6400 = 0.879375``.

    >>> schedule = LearningRateSchedule(28.0, warmup_steps=6400, decay_start_step=64000, decay_steps=80000)
    >>> round(schedule.lr_at(201), 4), schedule.lr_at(6400), schedule.lr_at(64000), schedule.lr_at(144000)
    (0.8794, 28.0, 28.0, 0.0)
"""
from __future__ import annotations

from typing import Iterable, Optional


class LearningRateSchedule:
    def __init__(self, base_lr: float, warmup_steps: int = 0, warmup_factor: int = 0,
                 decay_start_step: Optional[int] = None, decay_steps: int = 0, decay_power: float = 2.0,
                 end_lr: float = 0.0):
        if warmup_steps < 0 or decay_steps < 0:
            raise ValueError("--warmup_steps and --decay_steps must be >= 0")
        if warmup_factor < 0 or int(warmup_factor) != warmup_factor:
            raise ValueError(f"--warmup_factor must be a non-negative integer, got {warmup_factor}")
        self.base_lr = float(base_lr)
        self.warmup_steps = int(warmup_steps)
        self.warmup_factor = int(warmup_factor)
        self.decay_start_step = self.warmup_steps if decay_start_step is None else int(decay_start_step)
        if self.decay_start_step < self.warmup_steps:
            raise ValueError(f"learning-rate warmup must finish before decay starts: --decay_start_step "
                             f"{self.decay_start_step} < --warmup_steps {self.warmup_steps}")
        self.decay_steps = int(decay_steps)
        self.decay_power = float(decay_power)
        self.end_lr = float(end_lr)

    def lr_at(self, step: int) -> float:
        """Learning rate of the ``step``-th update (1-based)."""
        if self.warmup_steps > 0 and step <= self.warmup_steps:
            return self.base_lr * (1.0 - (self.warmup_steps - step) / (self.warmup_steps * 2 ** self.warmup_factor))
        if self.decay_steps > 0:
            decay_end = self.decay_start_step + self.decay_steps
            if step > decay_end:
                return self.end_lr
            if step > self.decay_start_step:
                remaining = (decay_end - step) / self.decay_steps
                return max(self.base_lr * remaining ** self.decay_power, self.end_lr)
        return self.base_lr

    def apply(self, optimizers: Iterable, step: int) -> float:
        """Set the rate of every param group of ``optimizers`` for update ``step``; returns it."""
        lr = self.lr_at(step)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        return lr
