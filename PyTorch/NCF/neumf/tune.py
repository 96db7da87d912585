"""``ncf.py --tune``: a small search on the validation split before the real run (off by default).

    python ncf.py --data D --tune --tune_budget_s 600 --tune_epochs 3

Trials, in this order, each ``--tune_epochs`` epochs at the run's batch, scored by the best validation HR@K (the
test series is never looked at): the run's learning rate ``L`` (the CPU default, or ``-l``), then ``L/2``, ``2L``,
``4L``; then a greedy walk from the best trial so far: twice its negatives (``-n``, up to 4x the run's), half its
factors and twice its factors (``-f``, within 4x of the run's either way: the CPU default's 16 sits between the 8
and 32 the published NeuMF was run with), again from each new best. A trial starts only
while the time spent plus the longest trial so far fits in ``--tune_budget_s``; each trial prints a line, the search
a table. The best trial's settings then train for the full ``-e`` epochs with everything else as given (the best
epoch chosen on validation, as always with the search). One process only: under torchrun the ranks' clocks could
stop the search at different trials.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from typing import Dict, List, Tuple

import torch

from .cli import ConfigurationError, settle
from .data import load_dataset
from .distributed import init_distributed

LEARNING_RATE_FACTORS = (1.0, 0.5, 2.0, 4.0)


@dataclasses.dataclass(frozen=True)
class Trial:
    """One point of the search: the flags it sets (argparse destinations) and what it reached."""
    learning_rate: float
    negative_samples: int
    factors: int
    valid_hr: float = -1.0
    best_epoch: int = -1
    seconds: float = 0.0

    def flags(self) -> str:
        return f"-l {self.learning_rate:g} -n {self.negative_samples} -f {self.factors}"


def next_trials(done: List[Trial], start: Trial) -> List[Trial]:
    """The trials still to run after ``done``: the learning rates around ``start``, then from the best trial so far
    twice the negatives, half and twice the factors (within 4x ``start``'s). Deterministic, so a budget only decides how far
    down the walk it gets.

    >>> start = Trial(0.002, 4, 64)
    >>> [t.learning_rate for t in next_trials([], start)]
    [0.002, 0.001, 0.004, 0.008]
    >>> done = [dataclasses.replace(t, valid_hr=hr) for t, hr in zip(next_trials([], start), (0.5, 0.4, 0.6, 0.55))]
    >>> [t.flags() for t in next_trials(done, start)]
    ['-l 0.004 -n 8 -f 64', '-l 0.004 -n 4 -f 32', '-l 0.004 -n 4 -f 128']
    """
    rates = [Trial(start.learning_rate * f, start.negative_samples, start.factors) for f in LEARNING_RATE_FACTORS]
    pending = [t for t in rates if not any(_same(t, d) for d in done)]
    if pending:
        return pending
    best = max(done, key=lambda t: t.valid_hr)
    later = []
    if 2 * best.negative_samples <= 4 * max(start.negative_samples, 1):
        later.append(Trial(best.learning_rate, max(2 * best.negative_samples, 1), best.factors))
    if best.factors // 2 >= max(start.factors // 4, 1):
        later.append(Trial(best.learning_rate, best.negative_samples, best.factors // 2))
    if 2 * best.factors <= 4 * start.factors:
        later.append(Trial(best.learning_rate, best.negative_samples, 2 * best.factors))
    return [t for t in later if not any(_same(t, d) for d in done)]


def _same(a: Trial, b: Trial) -> bool:
    return (a.learning_rate, a.negative_samples, a.factors) == (b.learning_rate, b.negative_samples, b.factors)


def trial_flags(args: argparse.Namespace, given: frozenset, trial: Trial, settled: Dict,
                **overrides) -> Tuple[argparse.Namespace, frozenset]:
    """``(args, given)`` of a run of ``trial``: the run's settled model and batch (``settled``: the CPU defaults
    included, so that a trial of -l or -f keeps the rest of the model the run would train), the trial's -l / -n / -f,
    all marked as given so that no CPU default replaces them."""
    values = dict(vars(args), **settled, learning_rate=trial.learning_rate, negative_samples=trial.negative_samples,
                  factors=trial.factors, select_on="validation", tune=False, **overrides)
    return argparse.Namespace(**values), given | set(settled) | {"learning_rate", "negative_samples", "factors"}


def run_trial(run, args: argparse.Namespace, given: frozenset, trial: Trial, settled: Dict, epochs: int,
              log_dir: str, index: int) -> Trial:
    """Train ``trial`` for ``epochs`` epochs with :func:`neumf.train.run` (validation selection, no checkpoints)."""
    trial_args, fixed = trial_flags(args, given, trial, settled, epochs=epochs, checkpoint_dir="", resume=False,
                                    threshold=1.0, log_path=os.path.join(log_dir, f"trial{index}.json"))
    started = time.perf_counter()
    summary = run(trial_args, fixed)
    key = next(k for k in summary if k.startswith("best_valid_hr@"))
    return dataclasses.replace(trial, valid_hr=summary[key], best_epoch=summary["best_epoch"],
                               seconds=time.perf_counter() - started)


def search(run, args: argparse.Namespace, given: frozenset, device: torch.device) -> Tuple[List[Trial], Dict]:
    """``(trials run within args.tune_budget_s, in order, the settings they share)``: the run's settled -b, MLP,
    dropout and Adam betas, see the module docstring."""
    data = load_dataset(args.data, args.feature_spec_file)
    base = settle(args, given, device, len(data.train_users) * (1 + args.negative_samples))
    settled = dict(batch_size=base.batch_size, layers=list(base.layers), dropout=base.dropout, beta1=base.beta1,
                   beta2=base.beta2)
    start = Trial(base.learning_rate, base.negative_samples, base.factors)
    done: List[Trial] = []
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ncf-tune-") as log_dir:
        while True:
            pending = next_trials(done, start)
            longest = max((t.seconds for t in done), default=0.0)
            if not pending or (done and time.perf_counter() - began + longest > args.tune_budget_s):
                break
            trial = run_trial(run, args, given, pending[0], settled, args.tune_epochs, log_dir, len(done))
            done.append(trial)
            print(f"ncf.py --tune: trial {len(done)}: {trial.flags()}: validation HR "
                  f"{trial.valid_hr:.4f} (epoch {trial.best_epoch}) in {trial.seconds:.1f} s", flush=True)
    return done, settled


def summary_table(trials: List[Trial], best: Trial) -> str:
    rows = ["| -l | -n | -f | validation HR | best epoch | seconds |", "|---|---|---|---|---|---|"]
    rows += [f"| {t.learning_rate:g} | {t.negative_samples} | {t.factors} | {t.valid_hr:.4f}"
             f"{' (chosen)' if t is best else ''} | {t.best_epoch} | {t.seconds:.1f} |" for t in trials]
    return "\n".join(rows)


def tuned_run(run, args: argparse.Namespace, given: frozenset) -> Dict:
    """``--tune``: :func:`search`, print its table, then :func:`neumf.train.run` with the best trial's settings."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigurationError("--tune runs in one process: tune first, then launch torchrun with its flags")
    if args.mode != "train" or args.resume:
        raise ConfigurationError("--tune applies to training from scratch (not --mode test or --resume)")
    trials, settled = search(run, args, given, init_distributed(args.device, args.local_rank)[2])
    best = max(trials, key=lambda t: t.valid_hr)   # the first of equals: the earlier, more default, trial
    print(f"ncf.py --tune: {len(trials)} trial(s) of {args.tune_epochs} epoch(s) within {args.tune_budget_s:g} s; "
          f"training with {best.flags()} -b {settled['batch_size']}\n{summary_table(trials, best)}", flush=True)
    summary = run(*trial_flags(args, given, best, settled))
    summary["tune"] = [dataclasses.asdict(t) for t in trials]
    return summary

