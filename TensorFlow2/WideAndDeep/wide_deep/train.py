"""The training loop of Wide & Deep: ``main(argv)`` (``python main.py``, or under
``horovodrun -np N sh hvd_wrapper.sh python main.py``) and ``train(config, spec, dist, on_cpu)``.

``main`` reads the flags (:mod:`wide_deep.cli`), hides the GPUs (``--cpu``), starts Horovod when a launcher started
this process (:class:`wide_deep.distributed.Dist`) and pins it (``--affinity``), reads the feature spec once, settles
the one frozen configuration (CPU defaults chosen first) and calls :func:`train`. TensorFlow and this package's
modules built on it (``wide_deep.model.network``, ``wide_deep.model.optimizers``) are imported late on purpose, by
:func:`train`'s helpers, once the devices, Horovod and the cores are settled.

Data parallel: each rank reads ``global_batch_size / world_size`` rows per step from its share of the parquet
partitions; gradients are averaged (dense allreduce; embedding gradients as ``IndexedSlices``, i.e. allgather);
rank 0's initial weights are broadcast, so every rank holds the same weights at every step. The loop
(:func:`train_epochs`) reads: step -> progress -> maybe checkpoint; after each epoch checkpoint -> evaluate.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

from recsys_common.cli import exit_status
from recsys_common.feature_spec import FeatureSpec
from recsys_common.horovod_launch import LauncherMismatchError
from recsys_common.logger import Logger, Progress, check_finite, hms
from recsys_common.metrics import ctr_sums, plot_reliability, reliability_sums
from recsys_common.plot_log import RELIABILITY_STEP, reliability_entry

from . import cli
from .checkpointing import Checkpointer
from .cli import WideDeepConfig
from .data.loader import ParquetBatches, read_feature_spec
from .distributed import Dist, set_affinity
from .evaluation import MissingClickError, compute_metrics, gather_rows
from .model.schedule import DeepLearningRateSchedule


class TrainingError(RuntimeError):
    """A run that cannot go on (NaN loss, bad flags): the message says where and why."""


# --------------------------------------------------------------------------------------------------- evaluation
def evaluate(model, batches, dist: Dist, predict_fn, with_map: bool = True,
             reliability_plot: Optional[str] = None, title: str = "",
             sums_out: Optional[Dict[str, list]] = None) -> Dict[str, float]:
    """Exact metrics over every rank's rows of ``batches`` (see :mod:`wide_deep.evaluation`);
    ``reliability_plot``: rank 0 also draws these rows' reliability diagram (PNG) there; ``sums_out``: filled with
    the rows' click sums and reliability buckets (``recsys_common.plot_log.reliability_entry``) for the log."""
    ids, probs, labels = [], [], []
    for features, y, display in batches:
        probs.append(predict_fn(features).numpy().astype(np.float64))
        labels.append(y.numpy())
        ids.append(display.numpy())
    ids, probs, labels = (np.concatenate(a) if a else np.zeros(0) for a in (ids, probs, labels))
    ids, probs, labels = gather_rows(ids, probs, labels, dist.allgather if dist.size > 1 else None)
    if ids.size == 0:
        raise TrainingError("the validation set is empty: nothing to evaluate")
    metrics = compute_metrics(ids, probs, labels, with_map=with_map)
    if (reliability_plot or sums_out is not None) and dist.rank == 0:   # every rank holds every row
        buckets, sums = reliability_sums(labels, probabilities=probs), ctr_sums(labels, probabilities=probs)
        if sums_out is not None:
            sums_out.update(reliability_entry(sums, buckets))
        if reliability_plot:
            plot_reliability(buckets, reliability_plot, title=title, sums=sums)
            print(f"reliability diagram: {reliability_plot}", flush=True)
    return metrics


def _log_tables(logger, sums: Dict[str, list]) -> None:
    """The last evaluation's click sums and reliability buckets as a ``RELIABILITY`` record of their own (the run's
    one summary keeps its metrics): ``python -m recsys_common.plot_log`` draws the diagram from it."""
    if sums:
        logger.log(RELIABILITY_STEP, sums)


def _print(dist: Dist, text: str) -> None:
    if dist.rank == 0:
        print(text, flush=True)


def _metric_text(metrics: Dict[str, float]) -> str:
    names = {"loss": "BCE", "auc": "AUC", "map12": "MAP@12", "normalized_entropy": "NE",
             "calibration": "calibration"}
    return " ".join(f"{names.get(k, k)} {v:.5f}" for k, v in metrics.items())


# --------------------------------------------------------------------------------------------------- main
def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Train (or ``--evaluate``, or ``--benchmark``) as the flags say; returns the results: the final evaluation's
    ``eval_loss`` / ``eval_auc`` / ``eval_map12``, or the benchmark's record. Raises ``InputError`` for a flag's
    value, and the errors of a run that cannot go on (``TrainingError``, ``FileNotFoundError``, ``ValueError``,
    ``LauncherMismatchError``); :func:`command` turns them into the exit status."""
    flags, given = cli.parse_flags(argv)
    if flags.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    dist = Dist()   # LauncherMismatchError when the launcher started several tasks and Horovod sees one
    try:
        # Before TensorFlow starts its thread pools, so that they size themselves to the cores kept.
        set_affinity(flags.affinity, dist.local_rank, dist.local_size)
        if flags.global_batch_size % dist.size or flags.eval_batch_size % dist.size:
            raise TrainingError(f"--global_batch_size ({flags.global_batch_size}) and --eval_batch_size "
                                f"({flags.eval_batch_size}) must be divisible by the number of ranks ({dist.size})")
        import tensorflow as tf   # late on purpose: see the module docstring
        on_cpu = flags.cpu or not tf.config.list_physical_devices("GPU")
        spec = read_feature_spec(flags.dataset_path, flags.fspec_file)   # the run's one parse of the spec
        # issue 18: NVIDIA's GPU batch is not a CPU default; chosen before the one frozen config is built
        config, cpu_line = cli.build_config(flags, given, on_cpu=on_cpu, world_size=dist.size, spec=spec)
        if cpu_line:
            _print(dist, cpu_line)
        return train(config, spec, dist, on_cpu)
    finally:
        dist.shutdown()


def command(argv: Optional[Sequence[str]] = None) -> int:
    """``python main.py``: :func:`main` as a command; the exit status (0; 2 for a flag's value; 1, with one
    ``main.py: error:`` line, for a run that cannot go on: NaN loss, missing checkpoint or data, launcher mismatch)."""
    return exit_status(main, argv, prog="main.py",
                       failures=(TrainingError, ValueError, FileNotFoundError, LauncherMismatchError))


# --------------------------------------------------------------------------------------------------- train
@dataclass
class Session:
    """What a run trains and evaluates: the model, its optimizers and step counter, its checkpoint, the batches."""
    model: Any
    wide_opt: Any
    deep_opt: Any
    step_var: Any
    checkpointer: Checkpointer
    start_step: int
    predict_fn: Callable
    loss_scale: bool
    train_batches: Optional[ParquetBatches]
    valid: ParquetBatches
    with_map: bool


def train(config: WideDeepConfig, spec: FeatureSpec, dist: Dist, on_cpu: bool) -> Dict[str, object]:
    """The run of ``config`` on the feature spec's data (``--evaluate``: evaluate the checkpoint; ``--benchmark``:
    time steps); returns what :func:`main` returns."""
    logger = _open_log(config, dist, on_cpu)
    session = _start(config, spec, dist, on_cpu, logger)
    if config.evaluate:
        if config.benchmark:
            return _benchmark_eval(config, session.valid, session.predict_fn, dist, logger)
        return _evaluate_checkpoint(config, session, dist, logger)
    steps_per_epoch = dist.min_int(len(session.train_batches))
    if steps_per_epoch < 1:
        raise TrainingError(f"the training set ({session.train_batches.num_rows} rows) is smaller than one batch "
                            f"per rank (--global_batch_size {config.global_batch_size} over {dist.size} rank(s))")
    train_step = _train_step(config, session, dist, steps_per_epoch)
    if config.benchmark:
        return _benchmark_train(config, session.train_batches, train_step, steps_per_epoch, dist, logger)
    last_sums: Dict[str, list] = {}   # the last evaluation's click sums and buckets, for the summary

    def evaluate_epoch(epoch: int) -> Dict[str, float]:
        final = epoch == config.num_epochs - 1   # --reliability_plot: the final evaluation's diagram
        try:
            return evaluate(session.model, session.valid, dist, session.predict_fn, session.with_map,
                            config.reliability_plot if final else None, f"W&D epoch {epoch + 1}", last_sums)
        except MissingClickError as e:
            raise TrainingError(f"evaluation after epoch {epoch + 1}: {e}. The epoch's checkpoint is saved in "
                                f"{session.checkpointer.directory}: fix the validation data (or pass "
                                f"--disable_map_calculation) and go on with --use_checkpoint") from e

    final = train_epochs(config, session.train_batches, train_step, steps_per_epoch, session.start_step, dist,
                         session.checkpointer, evaluate_epoch, logger)
    results = {f"eval_{k}": v for k, v in final.items()}
    _log_tables(logger, last_sums)
    logger.log_summary(results)
    _print(dist, "[final] " + _metric_text(final))
    logger.close()
    return results


def _open_log(config: WideDeepConfig, dist: Dist, on_cpu: bool) -> Logger:
    """The JSON log (every record; the console gets the progress and metric lines), its parameters written."""
    logger = Logger(os.path.join(config.results_dir, config.log_filename), rank=dist.rank, stdout=False,
                    append=config.use_checkpoint and not config.evaluate)
    logger.log_parameters({**asdict(config), "world_size": dist.size, "device": "CPU" if on_cpu else "GPU"})
    return logger


def _start(config: WideDeepConfig, spec: FeatureSpec, dist: Dist, on_cpu: bool, logger: Logger) -> Session:
    """Seeds, precision, the batches, the model and its optimizers, restored from the checkpoint or broadcast."""
    import tensorflow as tf   # late on purpose: see the module docstring
    from .model.network import build_model, configure_precision
    from .model.optimizers import create_optimizers
    tf.keras.utils.set_random_seed(config.seed)
    configure_precision(config.amp, on_cpu)
    batches = None if config.evaluate else ParquetBatches(
        spec, "train", config.global_batch_size // dist.size, dist.rank, dist.size, shuffle=not config.no_shuffle,
        seed=config.seed, drop_last=True)
    valid = ParquetBatches(spec, "test", config.eval_batch_size // dist.size, dist.rank, dist.size)
    model = build_model(spec, config.embedding_sizes_file, config.deep_hidden_units, config.deep_dropout,
                        config.combiner, config.seed)
    loss_scale = config.amp and not on_cpu  # float16 needs loss scaling; bfloat16 has float32's range
    wide_opt, deep_opt = create_optimizers(model, config.linear_learning_rate, config.deep_learning_rate, loss_scale)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpointer = Checkpointer(config.model_dir, model, wide_opt, deep_opt, step_var,
                                random_streams=model.deep.dropout_generators())
    start_step = 0
    if config.use_checkpoint:
        start_step = checkpointer.restore()
        logger.log("PARAMETER", {"restored_checkpoint": checkpointer.directory, "step": start_step})
    else:
        dist.broadcast_variables(model.variables)  # same initial weights on every rank
    # Every rank its own dropout masks (rank 0's are a single process's), from the position restored or the start.
    model.deep.set_dropout_stream(dist.rank)

    def predict(features):
        return tf.sigmoid(model(features, training=False))
    predict_fn = tf.function(predict, jit_compile=config.xla or None, reduce_retracing=True)
    with_map = not config.disable_map_calculation and valid.description["map"] is not None
    return Session(model, wide_opt, deep_opt, step_var, checkpointer, start_step, predict_fn, loss_scale, batches,
                   valid, with_map)


def _train_step(config: WideDeepConfig, session: Session, dist: Dist, steps_per_epoch: int):
    """``train_step(features, labels, step) -> loss``: the model's step at the scheduled deep learning rate."""
    import tensorflow as tf   # late on purpose: see the module docstring
    from .model.optimizers import make_train_step
    schedule = DeepLearningRateSchedule(config.deep_learning_rate, config.deep_warmup_epochs, config.num_epochs,
                                        steps_per_epoch)
    step_fn = make_train_step(session.model, session.wide_opt, session.deep_opt, xla=config.xla,
                              loss_scale=session.loss_scale, allreduce_grads=dist.allreduce_grads,
                              step_var=session.step_var)

    def train_step(features, labels, step):
        return step_fn(features, labels, tf.constant(schedule(step), tf.float32))
    return train_step


def _evaluate_checkpoint(config: WideDeepConfig, session: Session, dist: Dist, logger: Logger) -> Dict[str, object]:
    """``--evaluate``: the metrics of the model (restored with ``--use_checkpoint``) on the validation set."""
    sums: Dict[str, list] = {}
    metrics = evaluate(session.model, session.valid, dist, session.predict_fn, session.with_map,
                       config.reliability_plot, "W&D --evaluate", sums)
    results = {f"eval_{k}": v for k, v in metrics.items()}
    _log_tables(logger, sums)
    logger.log_summary(results)
    _print(dist, "[evaluate] " + _metric_text(metrics))
    return results


def train_epochs(config: WideDeepConfig, train_batches: ParquetBatches, train_step, steps_per_epoch: int,
                 start_step: int, dist: Dist, checkpointer: Checkpointer, evaluate_epoch, logger) -> Dict[str, float]:
    """Train from ``start_step`` to the end of ``--num_epochs``; returns the last evaluation's metrics.

    Each step: train step -> NaN check -> progress every ``print_freq`` -> checkpoint every
    ``checkpoint_every_steps``; after each epoch: checkpoint, then ``evaluate_epoch(epoch)`` (the checkpoint first:
    an evaluation that fails on the data, say a display without a click, must not cost the epoch's training).
    """
    total_steps = steps_per_epoch * config.num_epochs
    step = start_step
    start_epoch = step // steps_per_epoch
    # rate and time left of the progress line: samples since this run started, towards the last step
    progress = Progress("[train]", (total_steps - start_step) * config.global_batch_size, unit="samples", out=False)
    loss_sum, loss_n, metrics = 0.0, 0, None
    for epoch in range(start_epoch, config.num_epochs):
        train_batches.set_epoch(epoch)  # the shuffle seed of this epoch (the same after a resume)
        skip = step - epoch * steps_per_epoch  # resumed part-way into this epoch: skip the batches already seen
        for i, (features, labels, _) in enumerate(train_batches):
            if i >= steps_per_epoch:
                break
            if i < skip:
                continue
            loss = float(train_step(features, labels, step))
            step += 1
            check_finite(loss, "training loss is {value} at step {step} (epoch {epoch}); lower --deep_learning_rate "
                               "/ --linear_learning_rate or check the input data", TrainingError, step=step,
                         epoch=epoch + 1)
            progress.update(config.global_batch_size)
            loss_sum, loss_n = loss_sum + loss, loss_n + 1
            if step % config.print_freq == 0 or step == total_steps:
                rate = progress.rate()
                _print(dist, f"[train] epoch {epoch + 1}/{config.num_epochs} step {step}/{total_steps} "
                             f"loss {loss_sum / loss_n:.5f} {rate:,.0f} samples/s ETA {hms(progress.seconds_left())}")
                logger.log(step, {"loss": loss_sum / loss_n, "samples_per_s": rate})
                loss_sum, loss_n = 0.0, 0
            if config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0:
                _save(checkpointer, step, dist)
        train_batches.set_epoch(epoch + 1)
        _save(checkpointer, step, dist)
        metrics = evaluate_epoch(epoch)
        logger.log((epoch + 1,), {f"eval_{k}": v for k, v in metrics.items()})
        _print(dist, f"[eval] epoch {epoch + 1}/{config.num_epochs} " + _metric_text(metrics))
    return metrics if metrics is not None else evaluate_epoch(config.num_epochs - 1)


def _save(checkpointer: Checkpointer, step: int, dist: Dist) -> None:
    dist.barrier()  # every rank has applied this step
    if dist.rank == 0:
        checkpointer.save(step)
    dist.barrier()


# --------------------------------------------------------------------------------------------------- --benchmark
def _benchmark_train(config: WideDeepConfig, batches, train_step, steps_per_epoch, dist, logger) -> Dict[str, object]:
    """Runs warm-up + measured steps (cycling through epochs); prints ``{"samples_per_s": ...}`` as JSON."""
    total = config.benchmark_warmup_steps + config.benchmark_steps
    step, start = 0, None
    while step < total:
        for i, (features, labels, _) in enumerate(batches):
            if i >= steps_per_epoch or step >= total:
                break
            if step == config.benchmark_warmup_steps:
                dist.barrier()
                start = time.perf_counter()
            loss = train_step(features, labels, step)
            step += 1
    float(loss)  # wait for the last step
    dist.barrier()
    elapsed = time.perf_counter() - start
    result = {"mode": "train", "samples_per_s": config.benchmark_steps * config.global_batch_size / elapsed,
              "global_batch_size": config.global_batch_size, "steps": config.benchmark_steps,
              "world_size": dist.size, "amp": config.amp, "xla": config.xla}
    if dist.rank == 0:
        print(json.dumps(result), flush=True)
    logger.log_summary(result)
    return result


def _benchmark_eval(config: WideDeepConfig, valid, predict_fn, dist, logger) -> Dict[str, object]:
    """Runs warm-up + measured prediction steps over the validation set; prints ``{"samples_per_s": ...}``."""
    total = config.benchmark_warmup_steps + config.benchmark_steps
    step, start, samples = 0, None, 0
    while step < total:
        for features, _, _ in valid:
            if step >= total:
                break
            if step == config.benchmark_warmup_steps:
                start = time.perf_counter()
            out = predict_fn(features)
            if start is not None:
                samples += int(out.shape[0])
            step += 1
    out.numpy()
    elapsed = time.perf_counter() - start
    result = {"mode": "eval", "samples_per_s": samples * dist.size / elapsed, "steps": config.benchmark_steps,
              "world_size": dist.size}
    if dist.rank == 0:
        print(json.dumps(result), flush=True)
    logger.log_summary(result)
    return result
