"""Checkpoints that survive a crash and load on any number of ranks and any table placement.

``--save_checkpoint_path ROOT`` is a directory of checkpoints, one per saved training step, each complete or absent::

    ROOT/step_000000040/
        state.json               written last (its presence marks a complete checkpoint): format version, global
                                 step, epoch and batch within the epoch, optimizer iteration counters, the model
                                 configuration (table sizes, dims, model name, MLPs...) and the training settings
        dense/dense.index        the dense model's Keras weights and the dense optimizer's state
        dense/dense.data-*       (``tf.train.Checkpoint(dense=model.dense, optimizer=dense_optimizer)``, rank 0)
        sparse/table_<t>.npy     the WHOLE logical table t, float32 [rows, dim], however it was sharded
        sparse/table_<t>.<slot>.npy   the embedding optimizer's state of table t, same shape (``m``, ``v`` of LazyAdam)
        .recsys_outputs.json     the files written here (recsys_common.io manifest; pruning deletes only these)
    ROOT/step_000000080/         ... the newest ``--keep_checkpoints`` are kept

This is NVIDIA's layout (``ckpt/dense/`` + ``ckpt/sparse/<table>.npy``, reference A.3) made periodic, atomic and
placement-independent: a table file is the whole table in row-major ``.npy`` whatever the placement (table-wise,
column or row slices, data-parallel replicas), so any later placement reads it back by slicing.

Writing (collective, every rank calls :func:`save_checkpoint`):

1. rank 0 opens a staging directory (``recsys_common.io.atomic_directory``: ``ROOT/.step_<N>.tmp-*``), creates every
   table's ``.npy`` file at its full size (``np.lib.format.open_memmap``: the header, and a sparse file behind it)
   and tells the other ranks where it is; barrier;
2. every rank writes the rows/columns of its own shards into the memory-mapped files (a data-parallel table, the
   same on every rank, is written by rank 0 only), in row blocks, and fsyncs them; barrier;
3. rank 0 writes the dense part and ``state.json`` last, then commits: every file is fsync'd and the staging
   directory renamed to ``step_<N>`` in one step; then it prunes older checkpoints beyond ``keep``. Barrier.

A crash (SIGKILL, preemption) at any point leaves either the previous checkpoints alone, or a ``.step_<N>.tmp-*``
directory that nothing reads as a checkpoint and that the next save removes. Every rank must see the same
``ROOT`` (one node, or a shared file system across nodes): :class:`CheckpointManager` checks that before training
and refuses node-local directories with a clear error (``recsys_common.shared_storage``).

Reading (:func:`restore_checkpoint`): every rank reads only the slices of its own shards (``np.load(mmap_mode="r")``)
and the dense part; the saving run's world size and placement do not matter. The configuration must match (a
mismatch names the flag); a changed batch size or learning rate only warns. Restoring the training position is the
caller's part: the data loader skips ``global_step`` batches (``state["global_step"]``, ``state["epoch"]``,
``state["batch_in_epoch"]``).

Periodic saving during training: :class:`CheckpointManager` (``--checkpoint_every_steps`` and/or
``--checkpoint_every_minutes``; the minutes rule is decided by rank 0 and broadcast, so ranks always agree).
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from recsys_common import checkpoints as catalogue
from recsys_common.checkpoints import CheckpointError, checkpoint_name  # noqa: F401 (this recipe's names for them)
from recsys_common.io import MANIFEST_NAME, atomic_directory, atomic_write_text, read_manifest
from recsys_common.shared_storage import DirectoryNotSharedError, check_shared_directory

# TensorFlow (and hvd_utils, TensorFlow code) is imported inside the functions that touch tensors, on purpose: the
# serving commands and the training program's flag checks read checkpoints without a TensorFlow start-up.

LOG = logging.getLogger(__name__)

FORMAT_VERSION = 1
STATE_FILE = "state.json"
TOOL = "dlrm_dcnv2.checkpoint"
DENSE_PREFIX = os.path.join("dense", "dense")
# Rows written or read per block (in elements): bounds the host memory a save or restore needs beyond the model.
BLOCK_ELEMENTS = 1 << 22
# Training settings that may change on resume, with a warning (the run then no longer equals an uninterrupted one).
TRAINING_FIELDS = ("batch_size", "learning_rate", "warmup_steps", "decay_start_step", "decay_steps", "world_size")
# How a configuration field is set by the user, for the error message.
CONFIG_FLAGS = {
    "model": "the entry point (dlrm.py / dcnv2.py)",
    "table_sizes": "the feature spec's cardinalities (or --synthetic_dataset_cardinalities)",
    "embedding_dims": "--embedding_dim",
    "hotness": "the feature spec's hotness (or --synthetic_dataset_hotness)",
    "num_numerical_features": "the feature spec's numerical features (or --synthetic_dataset_num_numerical_features)",
    "interaction": "--interaction",
}


def table_file(table: int, slot: Optional[str] = None) -> str:
    """``sparse/table_<t>.npy`` (weights) or ``sparse/table_<t>.<slot>.npy`` (an optimizer slot), relative."""
    return os.path.join("sparse", f"table_{table}.npy" if slot is None else f"table_{table}.{slot}.npy")


# ------------------------------------------------------------------------------------------------ finding checkpoints
def list_checkpoints(root: str) -> List[Tuple[int, str]]:
    """Complete checkpoints (with ``state.json``) directly under ``root``, as ``(step, path)``, oldest first."""
    return catalogue.list_checkpoints(root, STATE_FILE)


def resolve_checkpoint(path: str) -> str:
    """``path`` itself when it is one checkpoint, else the newest complete checkpoint directly under it."""
    return catalogue.resolve_checkpoint(path, STATE_FILE, "--restore_checkpoint_path")


def read_state(path: str) -> Dict[str, Any]:
    """``state.json`` of checkpoint ``path`` (checked: a JSON object of this format version)."""
    return catalogue.read_marker(path, STATE_FILE, FORMAT_VERSION, required=("global_step", "tables"))


def check_config(state: Dict[str, Any], config: Dict[str, Any], where: str) -> None:
    """Refuse a checkpoint of a differently shaped or configured model, naming every differing field and its flag."""
    catalogue.check_config(state.get("config", {}), config, os.path.join(where, STATE_FILE), CONFIG_FLAGS)


def warn_training_changes(state: Dict[str, Any], training: Dict[str, Any], where: str) -> List[str]:
    return catalogue.warn_training_changes(state.get("training", {}), training, TRAINING_FIELDS, where,
                                           stacklevel=4)


# ------------------------------------------------------------------------------------------------ the .npy table files
def create_table_file(path: str, shape: Tuple[int, int]) -> None:
    """Create ``path`` as a float32 ``.npy`` of ``shape`` (header written; the data, a sparse file, filled later)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=tuple(int(n) for n in shape))
    array.flush()
    del array


def write_table_slice(path: str, rows: Tuple[int, int], cols: Tuple[int, int], value) -> None:
    """Write ``value`` (a ``[rows, cols]`` tf.Variable/tensor/array) into rows/cols of the table file ``path``; fsync.

    Copies in row blocks of about :data:`BLOCK_ELEMENTS` elements, so a rank needs no second copy of its shard.
    """
    array = np.load(path, mmap_mode="r+")
    num_rows, num_cols = rows[1] - rows[0], cols[1] - cols[0]
    if tuple(value.shape) != (num_rows, num_cols):
        raise ValueError(f"{path}: a shard of shape {tuple(value.shape)} for rows {rows} cols {cols}")
    step = max(1, BLOCK_ELEMENTS // max(1, num_cols))
    for start in range(0, num_rows, step):
        stop = min(num_rows, start + step)
        block = value[start:stop]
        block = block.numpy() if hasattr(block, "numpy") else np.asarray(block)
        array[rows[0] + start:rows[0] + stop, cols[0]:cols[1]] = block
    array.flush()
    del array
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # each rank makes its own writes durable (a shared file system may not share page caches)
    finally:
        os.close(fd)


def open_table_file(path: str, shape: Optional[Tuple[int, int]] = None) -> np.ndarray:
    """The table file ``path`` memory-mapped read-only, checked to be float32 and of ``shape`` when given."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing (an incomplete checkpoint, or one of a different optimizer?)")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable .npy file ({e})") from None
    if array.dtype != np.float32 or array.ndim != 2:
        raise CheckpointError(f"{path}: expected a float32 [rows, dim] table, found {array.dtype} {array.shape}")
    if shape is not None and tuple(array.shape) != tuple(shape):
        raise CheckpointError(f"{path}: the table has shape {tuple(array.shape)} in the checkpoint, the model "
                              f"expects {tuple(shape)} (a different --embedding_dim or table size?)")
    return array


def assign_table_slice(path: str, rows: Tuple[int, int], cols: Tuple[int, int], variable,
                       shape: Optional[Tuple[int, int]] = None) -> None:
    """``variable`` (shape of the slice) := the slice of the table file, in row blocks (bounded extra memory)."""
    array = open_table_file(path, shape)
    num_rows, num_cols = rows[1] - rows[0], cols[1] - cols[0]
    if tuple(variable.shape) != (num_rows, num_cols):
        raise CheckpointError(f"{path}: the model's shard {variable.name} has shape {tuple(variable.shape)}, not the "
                              f"rows {rows} x cols {cols} it is placed on")
    if num_rows * num_cols <= BLOCK_ELEMENTS:
        variable.assign(np.ascontiguousarray(array[rows[0]:rows[1], cols[0]:cols[1]]))
        return
    step = max(1, BLOCK_ELEMENTS // max(1, num_cols))
    for start in range(0, num_rows, step):
        stop = min(num_rows, start + step)
        variable[start:stop].assign(np.ascontiguousarray(array[rows[0] + start:rows[0] + stop, cols[0]:cols[1]]))


def read_table(path: str, table: int, slot: Optional[str] = None) -> np.ndarray:
    """Whole table ``table`` (or its optimizer ``slot``) of checkpoint ``path`` (or the newest under it), in memory.

    For tools and tests: it allocates the whole table.
    """
    path = resolve_checkpoint(path)
    return np.array(open_table_file(os.path.join(path, table_file(table, slot))))


# ------------------------------------------------------------------------------------------------ what is saved
def embedding_slots(optimizer, variable) -> Dict[str, Any]:
    """``{slot name: variable}`` of the embedding optimizer's state for ``variable`` ({} for SGD or no optimizer).

    The embedding optimizer exposes its per-variable state through ``slot_variables(var)`` (our LazyAdam);
    an optimizer without it must be stateless per variable (SGD without momentum).
    """
    if optimizer is None:
        return {}
    slots = getattr(optimizer, "slot_variables", None)
    if slots is None:
        return {}
    try:
        return dict(slots(variable) or {})
    except KeyError:  # no state for it yet (a legacy Keras optimizer creates slots on its first update): zeros
        return {}


def _shard_items(sparse_model, embedding_optimizer) -> List[Tuple[str, Tuple[int, int], Any, Any]]:
    """``(relative file, whole-table shape, ShardSpec, variable)`` for every local shard and its optimizer slots."""
    if not hasattr(sparse_model, "shard_variables"):
        raise CheckpointError(f"{type(sparse_model).__name__} does not expose its tables' shards (shard_variables): "
                              f"checkpoints are written for this recipe's placement only, not with "
                              f"--use_mde_embeddings (Merlin Distributed Embeddings has its own checkpoint format)")
    items = []
    for spec, variable in sparse_model.shard_variables:
        shape = (int(sparse_model.table_sizes[spec.table]), int(sparse_model.embedding_dims[spec.table]))
        items.append((table_file(spec.table), shape, spec, variable))
        for name, slot in sorted(embedding_slots(embedding_optimizer, variable).items()):
            if not re.fullmatch(r"[A-Za-z0-9_]+", name):
                raise ValueError(f"embedding optimizer slot name {name!r}: letters, digits and _ only (it names a file)")
            items.append((table_file(spec.table, name), shape, spec, slot))
    return items


def _optimizer_pair(optimizers) -> Tuple[Any, Any]:
    if optimizers is None:
        return None, None
    if isinstance(optimizers, (tuple, list)):
        if len(optimizers) != 2:
            raise ValueError(f"optimizers: expected (dense_optimizer, embedding_optimizer), got {len(optimizers)}")
        return optimizers[0], optimizers[1]
    return optimizers, optimizers  # one optimizer for everything (NVIDIA's shared SGD)


def _iterations(optimizer) -> Optional[int]:
    iterations = getattr(optimizer, "iterations", None) if optimizer is not None else None
    return None if iterations is None else int(iterations.numpy())


def _dense_checkpoint(dense_model, dense_optimizer):
    import tensorflow as tf
    objects = {"dense": dense_model}
    if dense_optimizer is not None:
        objects["optimizer"] = dense_optimizer
    return tf.train.Checkpoint(**objects)


# ------------------------------------------------------------------------------------------------ collectives
def _hvd():
    from dlrm_dcnv2.distributed import hvd_utils
    return hvd_utils


def _barrier(ctx) -> None:
    if ctx.world_size > 1:
        _hvd().barrier()


def _broadcast_text(text: Optional[str], ctx) -> str:
    """Rank 0's ``text`` on every rank (an allgather of its UTF-8 bytes: the other ranks send nothing)."""
    if ctx.world_size == 1:
        return text
    import tensorflow as tf
    data = (text or "").encode("utf-8") if ctx.rank == 0 else b""
    gathered = _hvd().allgather(tf.constant(np.frombuffer(data, dtype=np.uint8), dtype=tf.uint8),
                                name="checkpoint_text")
    return bytes(gathered.numpy().tobytes()).decode("utf-8")


def _agree(flag: bool, ctx) -> bool:
    """Rank 0's ``flag`` on every rank."""
    if ctx.world_size == 1:
        return bool(flag)
    return bool(_hvd().broadcast_value(int(bool(flag)), root=0))


def _check_shared(root: str, ctx) -> None:
    """Before training: every rank must see ``root`` (one node, or a file system shared by the nodes), since each
    rank writes its shards into rank 0's staging directory (``recsys_common.shared_storage``)."""

    def count(flag: bool) -> int:
        import tensorflow as tf
        total = _hvd().allreduce(tf.constant(1.0 if flag else 0.0), average=False, name="checkpoint_shared_count")
        return int(round(float(total.numpy())))
    try:
        check_shared_directory(root, ctx.rank, ctx.world_size, lambda text: _broadcast_text(text, ctx), count)
    except DirectoryNotSharedError as e:
        raise CheckpointError(str(e)) from None


def _all_ranks_true(flag: bool, ctx) -> bool:
    if ctx.world_size == 1:
        return bool(flag)
    import tensorflow as tf
    total = _hvd().allreduce(tf.constant(1.0 if flag else 0.0), average=False, name="checkpoint_all_true")
    return float(total.numpy()) == float(ctx.world_size)


def _finite(variable) -> bool:
    import tensorflow as tf
    rows = int(variable.shape[0]) if variable.shape.rank else 1
    cols = max(1, int(np.prod(variable.shape[1:]))) if variable.shape.rank else 1
    step = max(1, BLOCK_ELEMENTS // cols)
    if variable.shape.rank == 0 or rows <= step:
        return bool(tf.reduce_all(tf.math.is_finite(variable)).numpy())
    return all(bool(tf.reduce_all(tf.math.is_finite(variable[s:s + step])).numpy()) for s in range(0, rows, step))


# ------------------------------------------------------------------------------------------------ saving
def save_checkpoint(root: str, global_step: int, model, optimizers, ctx, config: Optional[Dict[str, Any]] = None,
                    epoch: Optional[int] = None, batch_in_epoch: Optional[int] = None,
                    training: Optional[Dict[str, Any]] = None, keep: int = 0,
                    extra: Optional[Dict[str, Any]] = None) -> str:
    """Collective: every rank calls it. Writes ``root/step_<global_step>`` atomically; returns its path.

    ``model``: has ``.sparse`` (``SparseModel``: ``shard_variables``, ``table_sizes``, ``embedding_dims``) and
    ``.dense`` (the Keras dense model, built); ``optimizers``: ``(dense_optimizer, embedding_optimizer)``, one
    optimizer for both, or None; ``ctx``: ``hvd_utils.Context``; ``config``: the model configuration that must
    match on restore (JSON-able); ``training``: settings that may change on resume (warned); ``keep``: afterwards
    remove all but the newest ``keep`` checkpoints under ``root`` (0 keeps all). Raises ``FloatingPointError``
    (nothing written) when any weight is NaN or infinite, so a diverged run never replaces a good checkpoint.
    """
    dense_optimizer, embedding_optimizer = _optimizer_pair(optimizers)
    sparse_model, dense_model = model.sparse, model.dense
    items = _shard_items(sparse_model, embedding_optimizer)
    local_ok = all(_finite(v) for v in list(dense_model.weights) + [v for _, _, _, v in items])
    if not _all_ranks_true(local_ok, ctx):
        raise FloatingPointError(f"the weights at step {global_step} are NaN or infinite (on some rank); not "
                                 f"saving them over the last good checkpoint in {root}")
    path = os.path.join(os.path.abspath(root), checkpoint_name(global_step))
    context, staging, error = None, None, None
    if ctx.rank == 0:
        try:
            os.makedirs(root, exist_ok=True)
            catalogue.remove_stale_temporaries(root)
            # overwrite=True: a step_<N> of ours (say, saved before a crash, then reached again) is replaced through
            # the manifest; a directory of that name holding files we did not write is refused, never deleted.
            context = atomic_directory(path, overwrite=True, tool=TOOL, marker=STATE_FILE)
            staging = context.__enter__()
            _create_table_files(staging, sparse_model, embedding_optimizer)
        except BaseException as e:  # tell the other ranks, so they fail too instead of waiting in a barrier
            error = e
            if context is not None and staging is not None:
                context.__exit__(type(e), e, e.__traceback__)  # removes the staging directory
            staging = None
    staging = _broadcast_text(staging or "", ctx)
    if not staging:
        if error is not None:
            raise error
        raise CheckpointError(f"{path}: rank 0 could not open the checkpoint for writing (see its error)")
    try:
        _barrier(ctx)  # every table file exists before anyone writes into it
        for rel, _, spec, variable in items:
            if spec.data_parallel and ctx.rank != 0:
                continue  # a replica: rank 0 writes it once
            write_table_slice(os.path.join(staging, rel), spec.rows, spec.cols, variable)
        _barrier(ctx)  # every rank's shards are written and fsync'd
        if ctx.rank == 0:
            _dense_checkpoint(dense_model, dense_optimizer).write(os.path.join(staging, DENSE_PREFIX))
            state = {
                "format_version": FORMAT_VERSION,
                "global_step": int(global_step),
                "epoch": None if epoch is None else int(epoch),
                "batch_in_epoch": None if batch_in_epoch is None else int(batch_in_epoch),
                "optimizer_iterations": {"dense": _iterations(dense_optimizer),
                                         "embedding": _iterations(embedding_optimizer)},
                "embedding_slots": sorted({name for _, v in sparse_model.shard_variables
                                           for name in embedding_slots(embedding_optimizer, v)}),
                "tables": [{"rows": int(r), "dim": int(d)}
                           for r, d in zip(sparse_model.table_sizes, sparse_model.embedding_dims)],
                "config": dict(config or {}),
                "training": dict(training or {}, world_size=ctx.world_size),
                "world_size": ctx.world_size,
                "placement": [{"table": s.table, "rank": s.rank, "rows": list(s.rows), "cols": list(s.cols)}
                              for s in getattr(getattr(sparse_model, "placement", None), "shards", ())],
                "saved_at": time.time(),
                **(extra or {}),
            }
            catalogue.write_marker(staging, STATE_FILE, state, indent=1)  # the marker, moved in last
    except BaseException as e:
        if context is not None:
            context.__exit__(type(e), e, e.__traceback__)
        raise
    if context is not None:
        context.__exit__(None, None, None)  # fsync every file and directory, rename into place
        if keep:
            prune_checkpoints(root, keep)
    _barrier(ctx)  # nobody goes on (or reads the checkpoint) before it is in place
    return path


def _create_table_files(staging: str, sparse_model, embedding_optimizer) -> None:
    """Rank 0: every table file (and optimizer slot file) at the whole table's shape."""
    slot_names = set()
    for _, variable in sparse_model.shard_variables:
        slot_names |= set(embedding_slots(embedding_optimizer, variable))
    for t, (rows, dim) in enumerate(zip(sparse_model.table_sizes, sparse_model.embedding_dims)):
        for slot in [None] + sorted(slot_names):
            create_table_file(os.path.join(staging, table_file(t, slot)), (int(rows), int(dim)))


def remove_checkpoint(path: str) -> bool:
    """Delete checkpoint ``path``: only the files our manifest lists (the marker first); True if the dir is gone.

    A file someone else put there is kept (and with it the directory, no longer a complete checkpoint).
    """
    entry = read_manifest(path).get(TOOL)
    if entry is None:
        LOG.warning("%s: no record of the files this recipe wrote there; not deleting it", path)
        return False
    marker = os.path.join(path, STATE_FILE)
    if os.path.isfile(marker):
        os.remove(marker)  # first: from here on it is no longer a complete checkpoint
    for rel in entry["files"]:
        full = os.path.join(path, rel)
        if os.path.lexists(full) and not os.path.isdir(full):
            os.remove(full)
    for rel in sorted(entry["directories"], key=lambda d: -d.count(os.sep)):
        try:
            os.rmdir(os.path.join(path, rel))
        except OSError:
            pass  # not empty: someone else's files are in it
    remaining = [n for n in os.listdir(path) if n != MANIFEST_NAME]
    if remaining:
        atomic_write_text(os.path.join(path, MANIFEST_NAME), json.dumps({"format": 1, "tools": {}}) + "\n")
        return False
    os.remove(os.path.join(path, MANIFEST_NAME))
    os.rmdir(path)
    return True


def prune_checkpoints(root: str, keep: int) -> List[str]:
    """Remove all but the newest ``keep`` complete checkpoints under ``root`` (``keep`` 0: none); returns them.

    Only the files our manifest lists are deleted (:func:`remove_checkpoint`)."""
    return [path for _, path in catalogue.prune_checkpoints(root, keep, STATE_FILE, remove_checkpoint)]


# ------------------------------------------------------------------------------------------------ restoring
def restore_checkpoint(path: str, model, optimizers=None, ctx=None, config: Optional[Dict[str, Any]] = None,
                       training: Optional[Dict[str, Any]] = None, load_optimizer: bool = True) -> Dict[str, Any]:
    """Load checkpoint ``path`` (one ``step_<N>``, or a directory of them: the newest) into ``model``.

    Every rank calls it and reads only its own shards' slices: any world size, any placement. ``config``: refuse
    a differently configured model (names the flags); ``training``: warn about changed settings. With
    ``load_optimizer`` and ``optimizers`` also the optimizers' state and iteration counters (resuming training):
    the dense optimizer's slots are restored when it is built (its first ``apply_gradients``, with the dense
    variables in the same order as when saved: ``model.dense.trainable_variables``). The model must be built
    (one forward pass) before. Returns ``state.json`` with ``state["path"]`` = the checkpoint loaded.
    """
    import tensorflow as tf
    path = resolve_checkpoint(path)
    state = read_state(path)
    if config is not None:
        check_config(state, config, path)
    world_size = ctx.world_size if ctx is not None else 1
    if training is not None:
        warn_training_changes(state, dict(training, world_size=world_size), path)
    sparse_model, dense_model = model.sparse, model.dense
    _shard_items(sparse_model, None)  # refuses a sparse model without shards (MDE) with a clear error
    tables = [(int(t["rows"]), int(t["dim"])) for t in state["tables"]]
    model_tables = [(int(r), int(d)) for r, d in zip(sparse_model.table_sizes, sparse_model.embedding_dims)]
    if tables != model_tables:
        raise CheckpointError(f"{os.path.join(path, STATE_FILE)}: tables (rows, dim) {tables} in the checkpoint, "
                              f"{model_tables} in the model (the feature spec's cardinalities or --embedding_dim "
                              f"differ)")
    dense_optimizer, embedding_optimizer = _optimizer_pair(optimizers if load_optimizer else None)
    saved_slots = set(state.get("embedding_slots", []))
    for spec, variable in sparse_model.shard_variables:
        shape = tables[spec.table]
        assign_table_slice(os.path.join(path, table_file(spec.table)), spec.rows, spec.cols, variable, shape)
        slots = _slots_for_restore(embedding_optimizer, variable, sparse_model)
        missing = sorted(set(slots) - saved_slots)
        if missing:
            raise CheckpointError(f"{path}: no embedding optimizer state {missing} (saved: {sorted(saved_slots)}): "
                                  f"the checkpoint was written with another --optimizer")
        for name, slot in slots.items():
            assign_table_slice(os.path.join(path, table_file(spec.table, name)), spec.rows, spec.cols, slot, shape)
    if not dense_model.weights:
        raise CheckpointError("the dense model has no weights yet: build it (one forward pass) before restoring")
    prefix = os.path.join(path, DENSE_PREFIX)
    if not os.path.isfile(prefix + ".index"):
        raise CheckpointError(f"{prefix}.index: missing (an incomplete checkpoint?)")
    try:
        status = _dense_checkpoint(dense_model, dense_optimizer).read(prefix)
        status.expect_partial()  # the optimizer's part is skipped when restoring weights only
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        raise CheckpointError(f"{prefix}: the dense model does not match the checkpoint's ({str(e)[:500]}); a "
                              f"different --bottom_mlp_dims, --top_mlp_dims, --interaction or cross layers?") from None
    if load_optimizer:
        iterations = state.get("optimizer_iterations", {})
        for optimizer, key in ((dense_optimizer, "dense"), (embedding_optimizer, "embedding")):
            if optimizer is not None and iterations.get(key) is not None and hasattr(optimizer, "iterations"):
                optimizer.iterations.assign(int(iterations[key]))
    if state.get("world_size") != world_size and (ctx is None or ctx.rank == 0):
        LOG.info("%s: saved by %s rank(s), restored on %d (each rank read its own shards)", path,
                 state.get("world_size"), world_size)
    state["path"] = path
    return state


def _slots_for_restore(optimizer, variable, sparse_model) -> Dict[str, Any]:
    """The embedding optimizer's slots of ``variable``, creating them (``optimizer.build``) when not there yet."""
    if optimizer is None or getattr(optimizer, "slot_variables", None) is None:
        return {}
    slots = embedding_slots(optimizer, variable)
    if not slots and hasattr(optimizer, "build"):
        optimizer.build([v for _, v in sparse_model.shard_variables])
        slots = embedding_slots(optimizer, variable)
    return slots


# ------------------------------------------------------------------------------------------------ periodic saving
class CheckpointManager:
    """Saves checkpoints of one training run under ``root``: every ``every_steps`` steps and/or ``every_minutes``.

    ``CheckpointManager(root, model, optimizers, ctx, config, every_steps, every_minutes, keep, training,
    overwrite, resumed_from)``; in the training loop call ``maybe_save(global_step, epoch, batch_in_epoch)``
    after each step, and ``save(...)`` once at the end (skipped when that step was just saved).

    Every rank must call them at the same steps (a save is collective): the step rule is the same everywhere; for
    the minutes rule rank 0 looks at its clock and broadcasts its decision (every ``TIME_CHECK_EVERY`` steps on
    several ranks, so most steps pay no collective; every step on one rank).

    A ``root`` that already holds checkpoints of another run is refused (resuming from the directory would pick
    whichever has the highest step), unless this run resumed from its newest checkpoint (``resumed_from``) or
    ``overwrite`` is set: those checkpoints are then deleted now (only files this recipe wrote).
    """
    TIME_CHECK_EVERY = 16

    def __init__(self, root: str, model, optimizers, ctx, config: Optional[Dict[str, Any]] = None,
                 every_steps: Optional[int] = None, every_minutes: Optional[float] = None, keep: int = 2,
                 training: Optional[Dict[str, Any]] = None, overwrite: bool = False,
                 resumed_from: Optional[str] = None):
        # rank 0's clock decides the minutes rule (broadcast), so every rank saves at the same step
        self.policy = catalogue.SavePolicy(every_steps, every_minutes, keep, ctx.world_size,
                                           lambda late: _agree(late, ctx), self.TIME_CHECK_EVERY)
        if os.path.lexists(root) and not os.path.isdir(root):
            raise CheckpointError(f"{root}: --save_checkpoint_path exists and is not a directory")
        _check_shared(root, ctx)
        self.root, self.model, self.optimizers, self.ctx = root, model, optimizers, ctx
        self.config, self.training = dict(config or {}), dict(training or {})
        self.every_steps, self.every_minutes, self.keep = every_steps, every_minutes, keep
        self.last_step: Optional[int] = None
        self.last_path: Optional[str] = None
        existing, resumed_here = catalogue.other_runs(root, STATE_FILE, resumed_from)
        if existing and not resumed_here:
            if not overwrite:
                raise CheckpointError(
                    f"{root}: already holds checkpoints of another run (newest: {existing[-1][1]}); pass "
                    f"--restore_checkpoint_path {root} to resume that run, --overwrite to replace them, or choose "
                    f"another --save_checkpoint_path")
            _barrier(ctx)  # every rank has looked before rank 0 deletes
            if ctx.rank == 0:
                for _, path in existing:
                    remove_checkpoint(path)
                LOG.info("%s: --overwrite: removed %d checkpoint(s) of an earlier run", root, len(existing))
            _barrier(ctx)
        elif resumed_here:  # its step is saved already
            self.last_step, self.last_path = existing[-1]

    def due(self, global_step: int) -> bool:
        """Whether a periodic checkpoint is due after ``global_step`` (the same answer on every rank)."""
        return self.policy.due(global_step)

    def maybe_save(self, global_step: int, epoch: Optional[int] = None,
                   batch_in_epoch: Optional[int] = None) -> Optional[str]:
        """Save when due (collective); returns the checkpoint path or None."""
        if not self.due(global_step):
            return None
        return self.save(global_step, epoch, batch_in_epoch)

    def save(self, global_step: int, epoch: Optional[int] = None, batch_in_epoch: Optional[int] = None) -> str:
        """Save now (collective; skipped when ``global_step`` is the last saved one); returns the path."""
        if global_step == self.last_step:
            return self.last_path
        self.last_path = save_checkpoint(self.root, global_step, self.model, self.optimizers, self.ctx, self.config,
                                         epoch, batch_in_epoch, self.training, self.keep)
        self.last_step = global_step
        self.policy.saved()
        if self.ctx.rank == 0:
            LOG.info("checkpoint saved: %s", self.last_path)
        return self.last_path
