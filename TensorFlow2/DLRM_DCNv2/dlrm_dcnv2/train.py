"""The one training / evaluation / inference program behind ``dlrm.py``, ``dcnv2.py`` and ``main.py --model``.

``main(argv, model="dlrm"|"dcnv2") -> dict`` of results; ``cli(argv, model)`` its exit status; ``command(model)``
what the shims run. What one run does, top to bottom::

    args, given_flags = cli.read_flags(argv, model)     the flags, checked before TensorFlow starts
    with session.started(args) as machine:              one process, or one rank of horovodrun; precision, seeds
        config = cli.settle(...)                        the one frozen config (feature spec parsed once, CPU
                                                        defaults chosen first)
        --mode train:     train(config, session.prepare_training(...)): the loop reads step -> progress every
                          --print_freq steps -> maybe evaluate (--evals_per_epoch times an epoch) -> maybe
                          checkpoint (--checkpoint_every_*)
        --mode eval:      one evaluation of the test split (BCE, approximate and exact AUC)
        --mode inference: throughput and mean/p90/p95/p99 latency per batch size
                                                        Horovod shut down, always

Errors the user can fix (a bad flag, bad data, a diverged run) raise exceptions that name the flag, file or step;
:func:`cli` prints them as one line and exits non-zero.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any, Dict, Iterator, List, NoReturn, Optional, Sequence

import numpy as np

from dlrm_dcnv2 import cli as flags
from dlrm_dcnv2.cli import DlrmDcnv2Config, UsageError
from dlrm_dcnv2.model.metrics import CLICK_METRICS, CORRECTED_CLICK_METRICS, click_metrics_text
from recsys_common.cli import exit_status
from recsys_common.horovod_launch import LauncherMismatchError
from recsys_common.logger import Logger, check_finite, hms
from recsys_common.metrics import plot_reliability
from recsys_common.plot_log import RELIABILITY_STEP, reliability_entry

LOG = logging.getLogger("dlrm_dcnv2")
LOGGED_EVALUATION = ("auc", "auc_exact", "loss", "throughput", *CLICK_METRICS, *CORRECTED_CLICK_METRICS)


# ------------------------------------------------------------------------------------------------------ entry
def main(argv: Optional[Sequence[str]] = None, model: str = "dlrm") -> Dict[str, Any]:
    """Run ``model`` ("dlrm" or "dcnv2") with command-line ``argv``; returns the results dict.

    Raises ``UsageError`` (bad flags), data errors, ``FloatingPointError`` (diverged); always tears Horovod down.
    """
    args, given_flags = flags.read_flags(argv, model)  # before TensorFlow starts: a bad flag costs no TF start-up
    # TensorFlow, and every module built on it, is imported here on purpose: once the flags are read.
    from dlrm_dcnv2 import session
    with session.started(args) as machine:
        config, cpu_line = flags.settle(args, given_flags, model, on_gpu=machine.on_gpu,
                                        world_size=machine.ctx.world_size)
        if cpu_line and machine.ctx.is_chief:
            print(cpu_line, flush=True)
        with run_logger(config, machine) as logger:
            if config.mode == "train":
                return train(config, session.prepare_training(config, machine), logger)
            evaluation = session.prepare_evaluation(config, machine)
            if config.mode == "eval":
                return evaluate(config, evaluation, logger)
            return benchmark(config, evaluation, logger)


def cli(argv: Optional[Sequence[str]] = None, model: Optional[str] = "dlrm") -> int:
    """The command line's exit status (recsys_common.cli): 2 for bad input (one ``error:`` line: a flag, the data,
    a checkpoint; every ``recsys_common.cli.InputError``), 1 for a failed run (``error: FloatingPointError: ...``:
    diverged, a launcher mismatch, an I/O error). ``model`` None: ``--model`` in ``argv`` picks it (NVIDIA's
    ``main.py``)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    def run_model(argv: Sequence[str]) -> Dict[str, Any]:
        name, rest = (model, list(argv)) if model is not None else flags.split_model(argv)
        if name not in flags.MODELS:
            raise UsageError(f"main.py needs --model {{{','.join(flags.MODELS)}}} (got {name!r}); or run dlrm.py / "
                             f"dcnv2.py, which set the model and its defaults")
        return main(rest, name)
    return exit_status(run_model, argv, with_type=True,
                       failures=(FloatingPointError, ValueError, OSError, LauncherMismatchError))


def command(model: Optional[str] = None) -> NoReturn:
    """``python dlrm.py`` / ``dcnv2.py`` / ``main.py --model X``: run and exit with :func:`cli`'s status."""
    sys.exit(cli(None, model))


@contextlib.contextmanager
def run_logger(config: DlrmDcnv2Config, machine) -> Iterator[Logger]:
    """The DLLogger-style log of ``--log_path`` (rank 0; an existing log is kept as <path>.N, never overwritten),
    its parameters written first; closed on exit."""
    logger = Logger(config.log_path if config.log_path else None, rank=machine.ctx.rank, stdout=False)
    try:
        params = {**config.flags(), "model": config.model, "given_flags": sorted(config.given_flags),
                  "world_size": machine.ctx.world_size, "precision": machine.policy,
                  "table_sizes": list(config.table_sizes), "hotness": list(config.hotness)}
        logger.log_parameters(params)
        for metric, unit in (("loss", None), ("auc", None), ("auc_exact", None), ("log_loss", None),
                             ("normalized_entropy", None), ("calibration", None), ("throughput", "samples/s"),
                             ("samples_per_s", "samples/s"), ("mean_step_time_ms", "ms")):
            logger.metadata(metric, {"unit": unit})  # DLLogger METADATA lines, as NVIDIA's log tools expect
        yield logger
    finally:
        logger.close()


# ------------------------------------------------------------------------------------------- eval / inference
def evaluate(config: DlrmDcnv2Config, evaluation, logger: Logger) -> Dict[str, Any]:
    """``--mode eval``: one evaluation of the test split (``evaluation``: ``session.prepare_evaluation``'s)."""
    stats: Dict[str, Any] = {}
    results = evaluation.evaluator.evaluate(evaluation.open_split("test", config.valid_batch_size), stats)
    if evaluation.ctx.is_chief:
        print(f"eval: auc {results['auc']:.5f} | exact auc {results['auc_exact']:.5f} | loss "
              f"{results['loss']:.5f}{click_metrics_text(results)} | {results['samples']} samples | "
              f"{results['throughput']:,.0f} samples/s", flush=True)
    write_reliability_plot(config.reliability_plot, stats, evaluation.ctx, f"{config.model} --mode eval")
    results["mode"] = "eval"
    log_reliability(logger, stats)
    logger.log_summary(dict(results))
    return results


def benchmark(config: DlrmDcnv2Config, evaluation, logger: Logger) -> Dict[str, Any]:
    """``--mode inference``: throughput and latency per batch size."""
    results: Dict[str, Any] = {"inference": evaluation.benchmark_inference()}
    if evaluation.ctx.is_chief:
        for size, r in results["inference"].items():
            print(f"inference batch {size}: {r['throughput']:.0f} samples/s, latency mean "
                  f"{r['latency_mean_ms']:.3f} ms, p90 {r['latency_p90_ms']:.3f}, p95 "
                  f"{r['latency_p95_ms']:.3f}, p99 {r['latency_p99_ms']:.3f}", flush=True)
    results["mode"] = "inference"
    logger.log_summary({f"{k}_bs{size}": v for size, r in results["inference"].items() for k, v in r.items()
                        if k != "latencies_ms"})
    return results


def log_reliability(logger: Logger, stats: Dict[str, Any]) -> None:
    """The last evaluation's summed click sums and buckets as a ``RELIABILITY`` record of their own (the run's one
    summary keeps its metrics): ``recsys_common.plot_log`` draws the reliability diagram from it."""
    if "reliability_sums" in stats:
        logger.log(RELIABILITY_STEP, reliability_entry(stats["ctr_sums"], stats["reliability_sums"]))


def write_reliability_plot(path: Optional[str], stats: Dict[str, Any], ctx, title: str) -> None:
    """``--reliability_plot``: the chief draws the evaluation's summed reliability buckets (``Evaluator.evaluate``'s
    ``stats``) with ``recsys_common.metrics.plot_reliability``; nothing when ``path`` is None."""
    if not path or not ctx.is_chief:
        return
    plot_reliability(stats["reliability_sums"], path, title=title, sums=stats["ctr_sums"])
    print(f"reliability diagram: {path}", flush=True)


# ------------------------------------------------------------------------------------------------ the loop
def eval_points(steps_per_epoch: int, evals_per_epoch: int) -> List[int]:
    """Steps within an epoch (1-based, after the step) after which to evaluate: evenly spaced, the last at the end."""
    evals = min(evals_per_epoch, steps_per_epoch)
    return sorted({max(1, round(steps_per_epoch * k / evals)) for k in range(1, evals + 1)})


class Throughput:
    """Training time and samples: whole loop iterations (waiting for the batch + the step), not evaluations or
    checkpoint saves (:meth:`pause` after those); the run's first step (tracing / XLA compilation) is left out of
    the totals. The progress line's rate is over the print window (training time only, as the totals)."""

    def __init__(self, first_step: int, total_steps: int, batch_size: int):
        self.first_step, self.total_samples = first_step, total_steps * batch_size
        self.train_time, self.samples, self.steps = 0.0, 0, 0
        self.window_time, self.window_rows = 0.0, 0
        self.tick = time.perf_counter()

    def pause(self) -> None:
        self.tick = time.perf_counter()

    def step(self, global_step: int, rows: int) -> None:
        now = time.perf_counter()
        elapsed, self.tick = now - self.tick, now
        if global_step > self.first_step + 1:  # the first step traces/compiles
            self.train_time += elapsed
            self.samples += rows
            self.steps += 1
        self.window_time += elapsed
        self.window_rows += rows

    def window_figures(self, global_step: int, batch_size: int):
        """``(samples/s, seconds left)`` over the window since the last call; starts a new window."""
        rate = self.window_rows / max(self.window_time, 1e-9)
        left = (self.total_samples - global_step * batch_size) / max(rate, 1e-9)
        self.window_time, self.window_rows = 0.0, 0
        return rate, left

    def results(self) -> Dict[str, float]:
        return {"throughput": self.samples / self.train_time if self.train_time > 0 else float("nan"),
                "mean_step_time_ms": 1000.0 * self.train_time / self.steps if self.steps else float("nan")}


class Loop:
    """The training loop's state and its four parts: :meth:`step`, :meth:`progress`, :meth:`evaluate`,
    :meth:`checkpoint` (``training``: ``session.prepare_training``'s)."""

    def __init__(self, config: DlrmDcnv2Config, training, logger: Logger, total_steps: int, test_data):
        self.config, self.training, self.logger, self.test_data = config, training, logger, test_data
        self.total_steps, self.chief = total_steps, training.ctx.is_chief
        self.global_step, self.epoch, self.batch_in_epoch = training.start
        self.timing = Throughput(self.global_step, total_steps, config.batch_size)
        self.last_loss = float("nan")
        self.window_losses: List[float] = []
        self.evaluations: List[Dict[str, Any]] = []
        self.last_stats: Dict[str, Any] = {}   # the last evaluation's summed sums, for --reliability_plot

    def step(self, batch) -> None:
        """One training step; the loss is the mean over ranks: every rank sees the same value and stops together.
        Fetching it every step costs a host sync (small next to a GPU step at NVIDIA's batch sizes) but stops a
        diverged run at the step it diverged, before a NaN weight reaches a checkpoint or another step."""
        self.training.profiler.step(self.global_step)
        loss = self.training.trainer.train_step(*batch)
        self.global_step += 1
        self.batch_in_epoch += 1
        self.last_loss = check_finite(
            float(loss), "training diverged: the loss is {value} at step {step} (epoch {epoch}, batch {batch}); "
            "lower --learning_rate (now {lr}), raise --warmup_steps, or check the data for NaN/inf",
            step=self.global_step, epoch=self.epoch, batch=self.batch_in_epoch, lr=self.config.learning_rate)
        self.timing.step(self.global_step, int(batch[2].shape[0]) * self.training.ctx.world_size)  # last: short
        self.window_losses.append(self.last_loss)

    def progress(self) -> None:
        """The progress line (chief) and log record of the steps since the last one."""
        rate, left = self.timing.window_figures(self.global_step, self.config.batch_size)
        mean_loss = float(np.mean(self.window_losses))
        lr = float(self.training.schedule.learning_rate_at(self.global_step))
        if self.chief:
            print(f"epoch {self.epoch} step {self.global_step}/{self.total_steps} | loss {mean_loss:.5f} | lr "
                  f"{lr:.6g} | {rate:,.0f} samples/s | ETA {hms(left)}", flush=True)
        self.logger.log(step=(self.epoch, self.global_step),
                        data={"loss": mean_loss, "learning_rate": lr, "samples_per_s": rate})
        self.window_losses = []

    def evaluate(self) -> None:
        """An evaluation of the test split (printed by the chief, logged); its time is not training time."""
        result = self.training.evaluator.evaluate(self.test_data, self.last_stats)
        result.update(step=self.global_step, epoch=self.epoch)
        self.evaluations.append(result)
        if self.chief:
            print(f"eval at step {self.global_step}: auc {result['auc']:.5f} | exact auc {result['auc_exact']:.5f} | "
                  f"loss {result['loss']:.5f}{click_metrics_text(result)} | {result['throughput']:,.0f} samples/s",
                  flush=True)
        self.logger.log(step=(self.epoch, self.global_step),
                        data={f"eval_{k}": result[k] for k in LOGGED_EVALUATION if k in result})
        self.timing.pause()

    def checkpoint(self) -> None:
        """A checkpoint when one is due (``--checkpoint_every_*``); saved after the evaluation of the same step, so a
        run killed in between redoes that evaluation on resume instead of skipping it. Not training time."""
        if self.training.checkpoints is not None:
            self.training.checkpoints.maybe_save(self.global_step, self.epoch, self.batch_in_epoch)
            self.timing.pause()


def train(config: DlrmDcnv2Config, training, logger: Logger) -> Dict[str, Any]:
    """``--mode train``: the training loop (``training``: ``session.prepare_training``'s); returns the results."""
    train_data = training.open_split("train", config.batch_size)
    test_data = training.open_split("test", config.valid_batch_size)
    steps_per_epoch = len(train_data)
    if steps_per_epoch == 0:
        raise UsageError(f"the training split has no full batch of --batch_size {config.batch_size}")
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps > 0:
        total_steps = min(total_steps, config.max_steps)
    if training.ctx.is_chief:
        print(f"training {config.model}: {total_steps} steps ({steps_per_epoch} per epoch, global batch "
              f"{config.batch_size}, {training.ctx.world_size} rank(s), {training.policy}"
              f"{', XLA' if config.xla else ''})", flush=True)
    points = set(eval_points(steps_per_epoch, config.evals_per_epoch))
    loop = Loop(config, training, logger, total_steps, test_data)
    start_epoch, start_batch = loop.epoch, loop.batch_in_epoch
    position = (start_epoch, start_batch)
    while loop.global_step < total_steps and loop.epoch < config.epochs:
        loop.batch_in_epoch = start_batch if loop.epoch == start_epoch else 0
        loop.timing.pause()
        for batch in train_data.iterate(loop.batch_in_epoch):
            if loop.global_step >= total_steps:
                break
            loop.step(batch)
            position = (loop.epoch, loop.batch_in_epoch)
            if loop.global_step % config.print_freq == 0 or loop.global_step == total_steps:
                loop.progress()
            if loop.batch_in_epoch in points or loop.global_step == total_steps:
                loop.evaluate()
            loop.checkpoint()
        loop.epoch += 1
    training.profiler.stop()
    if training.checkpoints is not None:
        # The position of the next batch: (epoch, batches done in it); a finished epoch resumes at its end.
        training.checkpoints.save(loop.global_step, position[0], position[1])
    return finish(config, training, logger, loop)


def finish(config: DlrmDcnv2Config, training, logger: Logger, loop: Loop) -> Dict[str, Any]:
    """The results of a training run: printed (chief), the reliability diagram drawn, the log's summary."""
    results: Dict[str, Any] = {"mode": "train", "global_step": loop.global_step, "train_loss": loop.last_loss,
                               **loop.timing.results(), "precision": training.policy,
                               "xla_jit_compiled": training.trainer.jit_compiled,
                               "world_size": training.ctx.world_size, "evaluations": loop.evaluations}
    if loop.evaluations:
        last = loop.evaluations[-1]
        results.update(auc=last["auc"], auc_exact=last["auc_exact"], loss=last["loss"],
                       **{k: last[k] for k in CLICK_METRICS + CORRECTED_CLICK_METRICS if k in last},
                       eval_throughput=last["throughput"], best_auc=max(e["auc"] for e in loop.evaluations))
        write_reliability_plot(config.reliability_plot, loop.last_stats, training.ctx,
                               f"{config.model} step {loop.global_step}")
    if training.checkpoints is not None and training.checkpoints.last_path:
        results["checkpoint"] = training.checkpoints.last_path
    if training.ctx.is_chief:
        summary = ", ".join(f"{k} {v:.5f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in results.items() if k not in ("evaluations",))
        print(f"done: {summary}", flush=True)
    log_reliability(logger, loop.last_stats)
    logger.log_summary({k: v for k, v in results.items() if k != "evaluations"})
    return results
