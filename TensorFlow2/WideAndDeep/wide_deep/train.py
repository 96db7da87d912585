"""The training / evaluation / benchmark entry point: ``main(argv)`` (``python main.py``, or under
``horovodrun -np N sh hvd_wrapper.sh python main.py``).

One process per rank. Horovod is initialised only under a launcher; a plain run is one rank without Horovod.
Data parallel: each rank reads ``global_batch_size / world_size`` rows per step from its share of the parquet
partitions; gradients are averaged (dense allreduce; embedding gradients as ``IndexedSlices``, i.e. allgather);
rank 0's initial weights are broadcast, so every rank holds the same weights at every step.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Horovod's TF bindings need tf-keras (Keras 3 breaks them)

import numpy as np  # noqa: E402

from .arguments import build_parser  # noqa: E402

from ..checkpointing import MARKER as CHECKPOINT_MARKER, TOOL as CHECKPOINT_TOOL, Checkpointer  # noqa: E402,F401


class TrainingError(RuntimeError):
    """A run that cannot go on (NaN loss, bad flags): the message says where and why."""


# --------------------------------------------------------------------------------------------------- Horovod
class Dist:
    """Rank, world size and the few collectives the loop needs; identity functions in a one-process run."""

    def __init__(self):
        self.hvd = None
        self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
        from recsys_common.horovod_launch import check_world_size, launched
        if launched():  # horovodrun, mpirun, or srun with several tasks
            import horovod.tensorflow as hvd
            hvd.init()
            try:  # several tasks launched but one Horovod rank: each would train alone (LauncherMismatchError)
                check_world_size(hvd.size())
            except Exception:
                hvd.shutdown()
                raise
            self.hvd = hvd
            self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
            self.local_size = hvd.local_size()

    def allreduce_grads(self, grads):
        if self.hvd is None:
            return grads
        return [self.hvd.allreduce(g, op=self.hvd.Average, name=f"grad_{i}") for i, g in enumerate(grads)]

    def broadcast_variables(self, variables) -> None:
        if self.hvd is not None:
            self.hvd.broadcast_variables(variables, root_rank=0)

    def allgather(self, array: np.ndarray) -> np.ndarray:
        if self.hvd is None:
            return array
        return self.hvd.allgather(array).numpy()

    def min_int(self, value: int) -> int:
        if self.hvd is None:
            return value
        return int(self.hvd.allreduce(np.array([value], np.int64), op=self.hvd.Min, name="min_int").numpy()[0])

    def barrier(self) -> None:
        if self.hvd is not None:
            self.hvd.allreduce(np.zeros(1, np.float32), name="barrier")

    def shutdown(self) -> None:
        if self.hvd is not None:
            self.hvd.shutdown()
            self.hvd = None


# --------------------------------------------------------------------------------------------------- pieces
def affinity_cores(mode: str, cores: Sequence[int], local_rank: int, local_size: int) -> List[int]:
    """The CPU cores rank ``local_rank`` of the ``local_size`` ranks of a node keeps under ``--affinity mode``.

    ``cores``: those this process may use (``os.sched_getaffinity``). NVIDIA's modes, over these cores (NVIDIA's
    recipe takes the cores of the GPU's socket from NVML; we have no GPU topology on CPU machines, so all of them):
    ``all``/``disabled``: every core; ``single``: the first; ``single_unique``: one per rank; ``unique_contiguous``: an
    even contiguous block per rank; ``unique_interleaved``: every ``local_size``-th core from ``local_rank``.
    """
    cores = sorted(cores)
    if mode in ("all", "disabled") or not cores:
        return cores
    if mode == "single":
        return cores[:1]
    if mode == "single_unique":
        return [cores[local_rank % len(cores)]]
    if local_size > len(cores):  # more ranks than cores: share them round-robin, one each
        return [cores[local_rank % len(cores)]]
    if mode == "unique_interleaved":
        return cores[local_rank::local_size]
    if mode == "unique_contiguous":
        block = len(cores) // local_size
        return cores[local_rank * block:(local_rank + 1) * block]
    raise ValueError(f"--affinity {mode!r}: expected all, single, single_unique, unique_interleaved, "
                     f"unique_contiguous or disabled")


def set_affinity(mode: str, local_rank: int, local_size: int) -> Optional[List[int]]:
    """Pin this process to :func:`affinity_cores` (Linux); returns the cores, or None where it cannot pin."""
    if mode == "disabled" or not hasattr(os, "sched_setaffinity"):
        return None
    cores = affinity_cores(mode, os.sched_getaffinity(0), local_rank, local_size)
    os.sched_setaffinity(0, cores)
    return cores


def configure_precision(amp: bool, cpu: bool):
    """Sets the Keras policy: ``mixed_bfloat16`` on CPU, ``mixed_float16`` on GPU (with loss scaling)."""
    import tensorflow as tf
    if amp:
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16" if cpu else "mixed_float16")
    else:
        tf.keras.mixed_precision.set_global_policy("float32")


def build_model(spec, embedding_sizes_file: str, hidden_units, dropout: float, combiner: str, seed: int):
    from .dataloader import input_description
    from .model import ModelConfig, WideDeepModel, load_embedding_sizes, resolve_embedding_sizes_path
    d = input_description(spec)
    categorical = list(d["onehot"]) + list(d["multihot"])
    dims = load_embedding_sizes(resolve_embedding_sizes_path(embedding_sizes_file), categorical)
    config = ModelConfig(onehot=d["onehot"], multihot=d["multihot"], max_hotness=d["max_hotness"],
                         numerical=d["numerical"], embedding_dims=dims, hidden_units=tuple(hidden_units),
                         dropout=dropout, combiner=combiner)
    return WideDeepModel(config, seed=seed).build_from_config()


def evaluate(model, batches, dist: "Dist", predict_fn, with_map: bool = True,
             reliability_plot: Optional[str] = None, title: str = "",
             sums_out: Optional[Dict[str, list]] = None) -> Dict[str, float]:
    """Exact metrics over every rank's rows of ``batches`` (see :mod:`wide_deep.trainer.evaluator`);
    ``reliability_plot``: rank 0 also draws these rows' reliability diagram (PNG) there; ``sums_out``: filled with
    the rows' click sums and reliability buckets (``recsys_common.plot_log.reliability_entry``) for the log."""
    from .evaluator import compute_metrics, gather_rows
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
        from recsys_common.metrics import ctr_sums, plot_reliability, reliability_sums
        from recsys_common.plot_log import reliability_entry
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
        from recsys_common.plot_log import RELIABILITY_STEP
        logger.log(RELIABILITY_STEP, sums)


def _print(dist: "Dist", text: str) -> None:
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
    from recsys_common.cli import InputError
    parser = build_parser()
    args = parser.parse_args(argv)
    from recsys_common.cpu_defaults import given_flags
    args.flags_given = sorted(given_flags(parser, argv))  # flags the CPU defaults must not replace
    for flag in ("global_batch_size", "eval_batch_size", "num_epochs", "benchmark_steps"):
        if getattr(args, flag) < 1:
            raise InputError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    dist = Dist()   # LauncherMismatchError when the launcher started several tasks and Horovod sees one
    try:
        # Before TensorFlow starts its thread pools, so that they size themselves to the cores kept.
        set_affinity(args.affinity, dist.local_rank, dist.local_size)
        return _run(args, dist)
    finally:
        dist.shutdown()


def _failures():
    from recsys_common.horovod_launch import LauncherMismatchError
    return (TrainingError, ValueError, FileNotFoundError, LauncherMismatchError)


def command(argv: Optional[Sequence[str]] = None) -> int:
    """``python main.py``: :func:`main` as a command; the exit status (0; 2 for a flag's value; 1, with one
    ``main.py: error:`` line, for a run that cannot go on: NaN loss, missing checkpoint or data, launcher mismatch)."""
    from recsys_common.cli import exit_status
    return exit_status(main, argv, prog="main.py", failures=_failures())


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
    import tensorflow as tf

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
    import tensorflow as tf
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
    import tensorflow as tf
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


def _run(args, dist: Dist) -> Dict[str, object]:
    import tensorflow as tf
    from recsys_common.logger import Logger
    from .dataloader import ParquetBatches, read_feature_spec
    from .evaluator import MissingClickError
    from .schedulers import DeepLearningRateSchedule

    if args.global_batch_size % dist.size or args.eval_batch_size % dist.size:
        raise TrainingError(f"--global_batch_size ({args.global_batch_size}) and --eval_batch_size "
                            f"({args.eval_batch_size}) must be divisible by the number of ranks ({dist.size})")
    cpu = args.cpu or not tf.config.list_physical_devices("GPU")
    from .cpu_defaults import apply_cpu_defaults  # issue 18: NVIDIA's GPU batch is not a CPU default
    cpu_line = apply_cpu_defaults(args, cpu, dist.size, read_feature_spec(args.dataset_path, args.fspec_file))
    if cpu_line:
        _print(dist, cpu_line)
    tf.keras.utils.set_random_seed(args.seed)
    configure_precision(args.amp, cpu)
    log_path = os.path.join(args.results_dir, args.log_filename)
    # The JSON log gets every record; the console gets the progress and metric lines printed below.
    logger = Logger(log_path, rank=dist.rank, stdout=False, append=args.use_checkpoint and not args.evaluate)
    logger.log_parameters({**vars(args), "world_size": dist.size, "device": "CPU" if cpu else "GPU"})

    spec = read_feature_spec(args.dataset_path, args.fspec_file)
    local_batch = args.global_batch_size // dist.size
    train = None if args.evaluate else ParquetBatches(
        spec, "train", local_batch, dist.rank, dist.size, shuffle=not args.no_shuffle, seed=args.seed,
        drop_last=True)
    valid = ParquetBatches(spec, "test", args.eval_batch_size // dist.size, dist.rank, dist.size)
    with_map = not args.disable_map_calculation and valid.description["map"] is not None

    model = build_model(spec, args.embedding_sizes_file, args.deep_hidden_units, args.deep_dropout,
                        args.combiner, args.seed)
    loss_scale = args.amp and not cpu  # float16 needs loss scaling; bfloat16 has float32's range
    wide_opt, deep_opt = create_optimizers(model, args.linear_learning_rate, args.deep_learning_rate, loss_scale)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpointer = Checkpointer(args.model_dir, model, wide_opt, deep_opt, step_var,
                                random_streams=model.deep.dropout_generators())
    start_step = 0
    if args.use_checkpoint:
        start_step = checkpointer.restore()
        logger.log("PARAMETER", {"restored_checkpoint": checkpointer.directory, "step": start_step})
    else:
        dist.broadcast_variables(model.variables)  # same initial weights on every rank
    # Every rank its own dropout masks (rank 0's are a single process's), from the position restored or the start.
    model.deep.set_dropout_stream(dist.rank)

    def predict(features):
        return tf.sigmoid(model(features, training=False))
    predict_fn = tf.function(predict, jit_compile=args.xla or None, reduce_retracing=True)

    if args.evaluate:
        if args.benchmark:
            return _benchmark_eval(BenchmarkConfig.from_flags(args), valid, predict_fn, dist, logger)
        sums: Dict[str, list] = {}
        metrics = evaluate(model, valid, dist, predict_fn, with_map, args.reliability_plot, "W&D --evaluate", sums)
        results = {f"eval_{k}": v for k, v in metrics.items()}
        _log_tables(logger, sums)
        logger.log_summary(results)
        _print(dist, "[evaluate] " + _metric_text(metrics))
        return results

    steps_per_epoch = dist.min_int(len(train))
    if steps_per_epoch < 1:
        raise TrainingError(f"the training set ({train.num_rows} rows) is smaller than one batch per rank "
                            f"(--global_batch_size {args.global_batch_size} over {dist.size} rank(s))")
    schedule = DeepLearningRateSchedule(args.deep_learning_rate, args.deep_warmup_epochs, args.num_epochs,
                                        steps_per_epoch)
    step_fn = make_train_step(model, wide_opt, deep_opt, xla=args.xla, loss_scale=loss_scale,
                              allreduce_grads=dist.allreduce_grads, step_var=step_var)

    def train_step(features, labels, step):
        return step_fn(features, labels, tf.constant(schedule(step), tf.float32))

    if args.benchmark:
        return _benchmark_train(BenchmarkConfig.from_flags(args), train, train_step, steps_per_epoch, dist, logger)

    last_sums: Dict[str, list] = {}   # the last evaluation's click sums and buckets, for the summary

    def evaluate_epoch(epoch: int) -> Dict[str, float]:
        final = epoch == args.num_epochs - 1   # --reliability_plot: the final evaluation's diagram
        try:
            return evaluate(model, valid, dist, predict_fn, with_map, args.reliability_plot if final else None,
                            f"W&D epoch {epoch + 1}", last_sums)
        except MissingClickError as e:
            raise TrainingError(f"evaluation after epoch {epoch + 1}: {e}. The epoch's checkpoint is saved in "
                                f"{checkpointer.directory}: fix the validation data (or pass "
                                f"--disable_map_calculation) and go on with --use_checkpoint") from e

    final = train_epochs(LoopConfig.from_flags(args), train, train_step, steps_per_epoch, start_step, dist,
                         checkpointer, evaluate_epoch, logger)
    results = {f"eval_{k}": v for k, v in final.items()}
    _log_tables(logger, last_sums)
    logger.log_summary(results)
    _print(dist, "[final] " + _metric_text(final))
    logger.close()
    return results


@dataclass(frozen=True)
class LoopConfig:
    """The training loop's settings, read once from the flags (:meth:`from_flags`)."""
    num_epochs: int = 20
    global_batch_size: int = 131072
    print_freq: int = 100
    checkpoint_every_steps: int = 0      # 0: only after each epoch

    @classmethod
    def from_flags(cls, args) -> "LoopConfig":
        return cls(num_epochs=args.num_epochs, global_batch_size=args.global_batch_size,
                   print_freq=args.print_freq, checkpoint_every_steps=args.checkpoint_every_steps)


def train_epochs(cfg: LoopConfig, train, train_step, steps_per_epoch: int, start_step: int, dist: Dist,
                 checkpointer: Checkpointer, evaluate_epoch, logger) -> Dict[str, float]:
    """Train from ``start_step`` to the end of ``--num_epochs``; returns the last evaluation's metrics.

    Each step: train step -> NaN check -> progress every ``print_freq`` -> checkpoint every
    ``checkpoint_every_steps``; after each epoch: checkpoint, then ``evaluate_epoch(epoch)`` (the checkpoint first:
    an evaluation that fails on the data, say a display without a click, must not cost the epoch's training).
    """
    from recsys_common.logger import Progress, check_finite, hms
    total_steps = steps_per_epoch * cfg.num_epochs
    step = start_step
    start_epoch = step // steps_per_epoch
    # rate and time left of the progress line: samples since this run started, towards the last step
    progress = Progress("[train]", (total_steps - start_step) * cfg.global_batch_size, unit="samples", out=False)
    loss_sum, loss_n, metrics = 0.0, 0, None
    for epoch in range(start_epoch, cfg.num_epochs):
        train._epoch = epoch  # the shuffle seed of this epoch (the same after a resume)
        skip = step - epoch * steps_per_epoch  # resumed part-way into this epoch: skip the batches already seen
        for i, (features, labels, _) in enumerate(train):
            if i >= steps_per_epoch:
                break
            if i < skip:
                continue
            loss = float(train_step(features, labels, step))
            step += 1
            check_finite(loss, "training loss is {value} at step {step} (epoch {epoch}); lower --deep_learning_rate "
                               "/ --linear_learning_rate or check the input data", TrainingError, step=step,
                         epoch=epoch + 1)
            progress.update(cfg.global_batch_size)
            loss_sum, loss_n = loss_sum + loss, loss_n + 1
            if step % cfg.print_freq == 0 or step == total_steps:
                rate = progress.rate()
                _print(dist, f"[train] epoch {epoch + 1}/{cfg.num_epochs} step {step}/{total_steps} "
                             f"loss {loss_sum / loss_n:.5f} {rate:,.0f} samples/s ETA {hms(progress.seconds_left())}")
                logger.log(step, {"loss": loss_sum / loss_n, "samples_per_s": rate})
                loss_sum, loss_n = 0.0, 0
            if cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0:
                _save(checkpointer, step, dist)
        train._epoch = epoch + 1
        _save(checkpointer, step, dist)
        metrics = evaluate_epoch(epoch)
        logger.log((epoch + 1,), {f"eval_{k}": v for k, v in metrics.items()})
        _print(dist, f"[eval] epoch {epoch + 1}/{cfg.num_epochs} " + _metric_text(metrics))
    return metrics if metrics is not None else evaluate_epoch(cfg.num_epochs - 1)


def _save(checkpointer: Checkpointer, step: int, dist: Dist) -> None:
    dist.barrier()  # every rank has applied this step
    if dist.rank == 0:
        checkpointer.save(step)
    dist.barrier()


@dataclass(frozen=True)
class BenchmarkConfig:
    """``--benchmark``'s settings, read once from the flags."""
    warmup_steps: int = 500
    steps: int = 1000
    global_batch_size: int = 131072
    amp: bool = False
    xla: bool = False

    @classmethod
    def from_flags(cls, args) -> "BenchmarkConfig":
        return cls(args.benchmark_warmup_steps, args.benchmark_steps, args.global_batch_size, args.amp, args.xla)


def _benchmark_train(cfg: BenchmarkConfig, train, train_step, steps_per_epoch, dist, logger) -> Dict[str, object]:
    """Runs warm-up + measured steps (cycling through epochs); prints ``{"samples_per_s": ...}`` as JSON."""
    total = cfg.warmup_steps + cfg.steps
    step, start = 0, None
    while step < total:
        for i, (features, labels, _) in enumerate(train):
            if i >= steps_per_epoch or step >= total:
                break
            if step == cfg.warmup_steps:
                dist.barrier()
                start = time.perf_counter()
            loss = train_step(features, labels, step)
            step += 1
    float(loss)  # wait for the last step
    dist.barrier()
    elapsed = time.perf_counter() - start
    result = {"mode": "train", "samples_per_s": cfg.steps * cfg.global_batch_size / elapsed,
              "global_batch_size": cfg.global_batch_size, "steps": cfg.steps,
              "world_size": dist.size, "amp": cfg.amp, "xla": cfg.xla}
    if dist.rank == 0:
        print(json.dumps(result), flush=True)
    logger.log_summary(result)
    return result


def _benchmark_eval(cfg: BenchmarkConfig, valid, predict_fn, dist, logger) -> Dict[str, object]:
    """Runs warm-up + measured prediction steps over the validation set; prints ``{"samples_per_s": ...}``."""
    total = cfg.warmup_steps + cfg.steps
    step, start, samples = 0, None, 0
    while step < total:
        for features, _, _ in valid:
            if step >= total:
                break
            if step == cfg.warmup_steps:
                start = time.perf_counter()
            out = predict_fn(features)
            if start is not None:
                samples += int(out.shape[0])
            step += 1
    out.numpy()
    elapsed = time.perf_counter() - start
    result = {"mode": "eval", "samples_per_s": samples * dist.size / elapsed, "steps": cfg.steps,
              "world_size": dist.size}
    if dist.rank == 0:
        print(json.dumps(result), flush=True)
    logger.log_summary(result)
    return result
