"""The one place the recipe talks to Horovod.

Every module uses these wrappers instead of ``horovod.tensorflow`` directly, so that

* a plain ``python dlrm.py`` (no ``horovodrun``) runs as one process without importing Horovod at all: every
  collective is then the identity (``allgather``/``alltoall`` of one rank return their input);
* under ``horovodrun -np N`` (gloo on CPU, NCCL/MPI on GPU clusters) the same calls are Horovod's collectives;
* teardown is one function, :func:`shutdown`, called in a ``finally`` of every entry point.

Usage::

    ctx = hvd_utils.init()            # Context(rank=0, world_size=1, local_rank=0) without horovodrun
    try:
        ...
        grads = [hvd_utils.allreduce(g) for g in grads]
    finally:
        hvd_utils.shutdown()
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, Optional, Sequence

import tensorflow as tf

from recsys_common.horovod_launch import check_world_size, launched

LOG = logging.getLogger(__name__)



@dataclasses.dataclass(frozen=True)
class Context:
    """Where this process stands in the job: ``rank`` in ``[0, world_size)``, ``local_rank`` on its node."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_chief(self) -> bool:
        """Rank 0: the one that logs, writes results and commits checkpoints."""
        return self.rank == 0


_hvd = None            # the horovod.tensorflow module once initialised by init(); None in a single process
_context: Optional[Context] = None


def launched_by_horovod() -> bool:
    """True when a launcher (horovodrun, mpirun, srun with several tasks) started this process as a rank
    (``recsys_common.horovod_launch``)."""
    return launched()


def init() -> Context:
    """Initialise Horovod when launched by ``horovodrun``/``mpirun``; otherwise a one-process context.

    Idempotent: later calls return the same context. On GPU machines each rank sees only the GPU of its
    ``local_rank`` (one GPU per rank, as NVIDIA's recipe runs).
    """
    global _hvd, _context
    if _context is not None:
        return _context
    if not launched_by_horovod():
        _context = Context(0, 1, 0)
        return _context
    import horovod.tensorflow as hvd  # imported only under a launcher: a plain run needs no Horovod at all
    hvd.init()
    try:
        check_world_size(hvd.size())  # several tasks launched but one Horovod rank: each would train alone
    except Exception:
        hvd.shutdown()
        raise
    _hvd = hvd
    _context = Context(rank=hvd.rank(), world_size=hvd.size(), local_rank=hvd.local_rank())
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        # Must happen before any op runs on a GPU; with several ranks per node each takes its own device.
        tf.config.set_visible_devices(gpus[_context.local_rank % len(gpus)], "GPU")
        for gpu in tf.config.list_visible_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
    LOG.info("Horovod initialised: rank %d of %d (local rank %d)", _context.rank, _context.world_size,
             _context.local_rank)
    return _context


def context() -> Context:
    """The context of :func:`init` (initialising it if nobody has yet)."""
    return _context if _context is not None else init()


def _distributed() -> bool:
    return _hvd is not None and _context is not None and _context.world_size > 1


def allreduce(tensor, average: bool = True, name: Optional[str] = None):
    """Sum (``average=False``) or mean of ``tensor`` over ranks; identity on one rank.

    Inside a ``tf.function`` pass a ``name`` that is the same on every rank (see :func:`alltoall`).

    ``tf.IndexedSlices`` (sparse gradients of data-parallel embedding tables) are allgathered, not densified:
    the result holds every rank's rows (duplicates sum when applied), values divided by the world size for a mean.
    """
    if not _distributed():
        return tensor
    if isinstance(tensor, tf.IndexedSlices):
        values = _hvd.allgather(tensor.values, name=None if name is None else name + "_values")
        indices = _hvd.allgather(tensor.indices, name=None if name is None else name + "_indices")
        if average:
            values = values / tf.cast(_context.world_size, values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    op = _hvd.Average if average else _hvd.Sum
    return _hvd.allreduce(tensor, op=op, name=name)


def allgather(tensor, name: Optional[str] = None):
    """Concatenation of every rank's ``tensor`` along axis 0, in rank order (ranks may send different lengths)."""
    if not _distributed():
        return tensor
    return _hvd.allgather(tensor, name=name)


def alltoall(tensor, splits: Sequence[int], name: str):
    """Send ``tensor[sum(splits[:r]) : sum(splits[:r+1])]`` (axis 0) to rank ``r``; return what every rank sent here.

    The result concatenates, in rank order, the piece each rank addressed to this one (its first dimension is the
    sum of those pieces; the other dimensions must agree on all ranks). Differentiable: the gradient is the
    all-to-all back. One rank: ``tensor`` itself (``splits`` must then be ``[len(tensor)]``).

    ``name`` must be the same on every rank. Horovod pairs the ranks' collectives by name, and the names it
    derives itself come from graph tensor names, which differ between ranks whose graphs differ (each rank owns
    other shards): so both directions are named here, the backward one ``<name>_grad``.
    """
    if not _distributed():
        return tensor
    splits = tf.convert_to_tensor(splits, dtype=tf.int32)

    @tf.custom_gradient
    def exchange(value):
        output, received_splits = _hvd.alltoall(value, splits=splits, name=name)

        def backward(upstream):
            grad, _ = _hvd.alltoall(upstream, splits=received_splits, name=name + "_grad")
            return grad

        return output, backward

    return exchange(tensor)


def broadcast_variables(variables: Iterable[tf.Variable], root: int = 0) -> None:
    """Assign rank ``root``'s values to ``variables`` on every rank (no-op on one rank)."""
    variables = list(variables)
    if not _distributed() or not variables:
        return
    _hvd.broadcast_variables(variables, root_rank=root)


def broadcast_value(value: int, root: int = 0) -> int:
    """Rank ``root``'s python int on every rank (for instance a random seed drawn on rank 0)."""
    if not _distributed():
        return int(value)
    return int(_hvd.broadcast(tf.constant(int(value), dtype=tf.int64), root_rank=root).numpy())


def barrier() -> None:
    """Wait until every rank gets here (an allreduce of one number: Horovod 0.28's TF API has no barrier)."""
    if _distributed():
        _hvd.allreduce(tf.constant(0.0), op=_hvd.Sum, name="recsys_barrier").numpy()


def shutdown() -> None:
    """The one teardown of every entry point (safe to call twice, and when :func:`init` never ran).

    Shuts Horovod's background thread down explicitly: letting interpreter exit do it while gloo still holds
    sockets is what makes multi-process runs abort at exit now and then.
    """
    global _hvd, _context
    hvd, _hvd, _context = _hvd, None, None
    if hvd is not None:
        try:
            hvd.shutdown()
        except Exception as error:  # noqa: BLE001  (a failing teardown must not hide the run's own error)
            LOG.warning("horovod shutdown failed: %s", error)



def compile_step(fn, xla: bool = False):
    """``tf.function`` of a train/eval step; with ``xla``, XLA-compiled in the way that works for the world size.

    One process: ``jit_compile=True`` (the whole step is one XLA program). Several ranks: Horovod's collectives
    have no XLA kernels (``No registered 'HorovodAlltoall' OpKernel for XLA_CPU_JIT``), so the step cannot be
    compiled whole; XLA auto-clustering then compiles everything around them, which is what NVIDIA's recipe runs
    (``TF_XLA_FLAGS=--tf_xla_auto_jit=fusible``, "XLA Lite").
    """
    if not xla:
        return tf.function(fn)
    if _distributed():
        tf.config.optimizer.set_jit("autoclustering")
        return tf.function(fn)
    return tf.function(fn, jit_compile=True)
