"""The TensorFlow side of one run of ``dlrm.py`` / ``dcnv2.py``: what :mod:`dlrm_dcnv2.train` drives.

    with started(args) as machine:         Horovod (one process, or one rank of horovodrun), devices, threads,
                                           precision policy (--amp), seeds; always torn down
        training = prepare_training(config, machine)       model, optimizers and schedule, the checkpoint
                                                           restored (or replicated weights broadcast), the
                                                           checkpoint manager, the trainer and the evaluator
        evaluation = prepare_evaluation(config, machine)   model restored for --mode eval / inference

This module imports TensorFlow (and the modules built on it); :mod:`dlrm_dcnv2.train` imports it once the flags are
read, so that a bad flag costs no TensorFlow start-up.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

import tensorflow as tf

from dlrm_dcnv2 import checkpointing
from dlrm_dcnv2.cli import DlrmDcnv2Config, UsageError
from dlrm_dcnv2.distributed import hvd_utils
from dlrm_dcnv2.distributed.gradients import broadcast_replicated_variables
from dlrm_dcnv2.model.evaluator import Evaluator
from dlrm_dcnv2.model.inference import benchmark_inference
from dlrm_dcnv2.model.lr_scheduler import WarmupPolyDecay
from dlrm_dcnv2.model.model import RecModel, build_model
from dlrm_dcnv2.model.optimizers import create_optimizers
from dlrm_dcnv2.model.trainer import Trainer
from recsys_common.machine import cpu_bf16_instructions

LOG = logging.getLogger("dlrm_dcnv2")


@dataclass(frozen=True)
class Machine:
    """What the run learnt from Horovod and TensorFlow before its configuration was settled."""
    ctx: hvd_utils.Context
    policy: str          # "float32", "mixed_float16" (GPU --amp) or "mixed_bfloat16" (CPU --amp)
    on_gpu: bool


def configure_tensorflow(cpu: bool, amp: bool, inter_op_parallelism: Optional[int] = None,
                         intra_op_parallelism: Optional[int] = None) -> Tuple[str, bool]:
    """Device visibility (``cpu``: hide the GPUs), threads, precision policy (``amp``); returns ``(policy name,
    on_gpu)``. Must run before any model is built."""
    if cpu:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError as error:  # devices already initialised (a second run in the same process)
            if tf.config.get_visible_devices("GPU"):
                raise UsageError(f"--cpu: cannot hide the GPUs any more ({error})") from None
    for name, value, setter in (
            ("inter_op_parallelism", inter_op_parallelism, tf.config.threading.set_inter_op_parallelism_threads),
            ("intra_op_parallelism", intra_op_parallelism, tf.config.threading.set_intra_op_parallelism_threads)):
        if value is not None:
            try:
                setter(value)
            except RuntimeError as error:
                LOG.warning("--%s %d ignored: %s", name, value, error)
    on_gpu = bool(tf.config.get_visible_devices("GPU"))
    # float16 has too few exponent bits without loss scaling and CPUs have no fast float16 kernels;
    # bfloat16 keeps float32's range and is what CPUs with AVX512-BF16/AMX accelerate.
    policy = ("mixed_float16" if on_gpu else "mixed_bfloat16") if amp else "float32"
    if policy == "mixed_bfloat16":
        instructions = cpu_bf16_instructions()
        if instructions in ("amx", "avx512_bf16"):
            LOG.info("--amp: mixed_bfloat16 on this CPU's %s instructions", instructions)
        else:
            # With AVX512-BF16 or AMX oneDNN runs bf16 GEMMs natively (README: the issue 18 figures); without them
            # it converts around every product, which is usually slower than float32.
            LOG.warning("--amp: this CPU has no bfloat16 instructions (no avx512_bf16 or amx_bf16 in /proc/cpuinfo): "
                        "mixed_bfloat16 is emulated and likely slower than float32; drop --amp for speed")
    tf.keras.mixed_precision.set_global_policy(policy)
    return policy, on_gpu


@contextlib.contextmanager
def started(args) -> Iterator[Machine]:
    """Horovod and TensorFlow set up for the flags ``args`` (``cli.read_flags``); on exit, always, Horovod shut
    down and the precision policy restored (a test or notebook calling ``main()`` again starts clean)."""
    previous_policy = tf.keras.mixed_precision.global_policy().name
    try:
        ctx = hvd_utils.init()
        policy, on_gpu = configure_tensorflow(args.cpu, args.amp, args.inter_op_parallelism,
                                              args.intra_op_parallelism)
        if args.seed is not None:
            tf.keras.utils.set_random_seed(args.seed)  # the same on every rank (replicated weights are broadcast)
        yield Machine(ctx, policy, on_gpu)
    finally:
        tf.keras.mixed_precision.set_global_policy(previous_policy)
        hvd_utils.shutdown()


def model_of(config: DlrmDcnv2Config, ctx) -> RecModel:
    """The model of the settled configuration; ``build_model`` picks the interaction
    (``model.interaction.select_interaction``): it raises for --xla with NVIDIA's custom CUDA op and logs when
    dot_custom_cuda falls back to dot_tensorflow."""
    return build_model(table_sizes=config.table_sizes, embedding_dims=config.embedding_dims,
                       bottom_mlp_dims=config.bottom_mlp_dims, top_mlp_dims=config.top_mlp_dims,
                       interaction=config.interaction, num_numerical_features=config.num_numerical,
                       hotness=config.hotness, num_cross_layers=config.num_cross_layers,
                       cross_layer_projection_dim=config.cross_layer_projection_dim, ctx=ctx, seed=config.seed,
                       xla=config.xla, dist_strategy=config.dist_strategy,
                       column_slice_threshold=config.column_slice_threshold,
                       row_slice_threshold=config.row_slice_threshold,
                       data_parallel_threshold=config.data_parallel_threshold,
                       cpu_offloading_threshold_gb=config.cpu_offloading_threshold_gb,
                       use_mde_embeddings=config.use_mde_embeddings,
                       embedding_zeros_initializer=config.embedding_zeros_initializer,
                       embedding_trainable=config.embedding_trainable)


@dataclass
class Evaluation:
    """A model to evaluate or benchmark (``--mode eval`` / ``inference``) and what reads its data."""
    config: DlrmDcnv2Config
    ctx: hvd_utils.Context
    model: RecModel
    evaluator: Evaluator

    def open_split(self, mapping: str, global_batch_size: int):
        """This rank's batches of ``mapping`` ("train" / "test"), the run's feature spec handed down."""
        return self.config.data.open(mapping, global_batch_size, self.ctx, self.model.sparse.placement)

    def benchmark_inference(self) -> Dict[str, Dict[str, Any]]:
        """``--mode inference``: throughput and latency per ``--inference_batch_sizes`` entry."""
        c = self.config
        return benchmark_inference(self.model, lambda size: self.open_split("test", size), c.inference_sizes,
                                   self.ctx, steps=c.inference_steps, warmup_steps=c.inference_warmup_steps,
                                   xla=c.xla, run_eagerly=c.run_eagerly)


def _evaluation(config: DlrmDcnv2Config, ctx) -> Evaluation:
    model = model_of(config, ctx)
    evaluator = Evaluator(model, ctx, auc_thresholds=config.auc_thresholds, xla=config.xla,
                          run_eagerly=config.run_eagerly,
                          negative_downsampling_rate=config.data.negative_downsampling_rate)
    return Evaluation(config, ctx, model, evaluator)


def prepare_evaluation(config: DlrmDcnv2Config, machine: Machine) -> Evaluation:
    """``--mode eval`` / ``inference``: the model, with ``--restore_checkpoint_path`` loaded (else untrained, with a
    warning)."""
    evaluation = _evaluation(config, machine.ctx)
    if config.restore_checkpoint_path:
        checkpointing.restore_checkpoint(config.restore_checkpoint_path, evaluation.model, None, machine.ctx,
                                         config=config.model_config(), load_optimizer=False)
    else:
        LOG.warning("--mode %s without --restore_checkpoint_path: the model is untrained", config.mode)
    return evaluation


@dataclass
class Training(Evaluation):
    """Everything the training loop drives, ready at its first step (``start``: step, epoch, batch in epoch)."""
    policy: str = "float32"
    schedule: Optional[WarmupPolyDecay] = None
    trainer: Optional[Trainer] = None
    checkpoints: Optional[checkpointing.CheckpointManager] = None
    start: Tuple[int, int, int] = (0, 0, 0)
    profiler: Optional["Profiler"] = None


def prepare_training(config: DlrmDcnv2Config, machine: Machine) -> Training:
    """``--mode train``: the model and its optimizers (one learning-rate schedule), resumed from
    ``--restore_checkpoint_path`` or with replicated weights made equal on every rank, the checkpoint manager of
    ``--save_checkpoint_path`` and the trainer."""
    ctx = machine.ctx
    evaluation = _evaluation(config, ctx)
    model = evaluation.model
    schedule = WarmupPolyDecay(config.learning_rate, config.warmup_steps, config.decay_start_step,
                               config.decay_steps)
    dense_optimizer, embedding_optimizer = create_optimizers(config.optimizer, schedule, beta1=config.beta1,
                                                             beta2=config.beta2)
    optimizers = (dense_optimizer, embedding_optimizer)
    training = config.resume_settings(ctx.world_size)
    start = (0, 0, 0)
    if config.restore_checkpoint_path:
        state = checkpointing.restore_checkpoint(config.restore_checkpoint_path, model, optimizers, ctx,
                                                 config=config.model_config(), training=training,
                                                 load_optimizer=True)
        start = (int(state.get("global_step", 0)), int(state.get("epoch") or 0), int(state.get("batch_in_epoch") or 0))
        if ctx.is_chief:
            print(f"resumed from {state['path']} at step {start[0]} (epoch {start[1]}, batch {start[2]})", flush=True)
    else:
        # Replicated weights start equal on every rank (model-parallel shards are seeded per table already).
        broadcast_replicated_variables(model.trainable_variables, model.sparse.model_parallel_variables)
    manager = None
    if config.save_checkpoint_path:
        manager = checkpointing.CheckpointManager(
            config.save_checkpoint_path, model, optimizers, ctx, config.model_config(),
            every_steps=config.checkpoint_every_steps, every_minutes=config.checkpoint_every_minutes,
            keep=config.keep_checkpoints, training=training, overwrite=config.overwrite,
            resumed_from=config.restore_checkpoint_path)
    trainer = Trainer(model, dense_optimizer, embedding_optimizer, ctx,
                      loss_scale=config.loss_scale if machine.policy == "mixed_float16" else None, xla=config.xla,
                      run_eagerly=config.run_eagerly)
    profiler = Profiler(config.profiler_start_step, ctx.rank == config.profiled_rank % ctx.world_size,
                        config.profile_dir)
    return Training(config, ctx, model, evaluation.evaluator, machine.policy, schedule, trainer, manager, start,
                    profiler)


class Profiler:
    """``--profiler_start_step``: a TensorFlow profile of 10 steps of one rank (``--profiled_rank``)."""

    def __init__(self, start_step: Optional[int], on_this_rank: bool, directory: str):
        self.start_step = start_step if on_this_rank else None
        self.directory, self.active = directory, False

    def step(self, global_step: int) -> None:
        if self.start_step is None:
            return
        if global_step == self.start_step:
            tf.profiler.experimental.start(self.directory)
            self.active = True
        elif self.active and global_step == self.start_step + 10:
            self.stop()

    def stop(self) -> None:
        if self.active:
            tf.profiler.experimental.stop()
            self.active = False
