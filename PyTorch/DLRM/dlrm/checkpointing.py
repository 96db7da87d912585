"""Checkpoints that survive a crash and do not depend on the number of processes or the embedding implementation.

``--save_checkpoint_path ROOT`` is a directory of checkpoints, one per saved training step, each complete or absent:

    ROOT/step_000000040/
        meta.json              written last: format version, model config, training position and flags, world size
        dense.pt               dense-optimizer and loss-scaler state, scalar optimizer state (torch.save; loaded with
                               weights_only=True)
        rng.pt                 every process's RNG states (torch, CUDA, numpy, random), in rank order
        model/dense/           torch.distributed.checkpoint (DCP) of the MLP weights (.metadata + .distcp files)
        model/table_<i>/       DCP of table i and its optimizer state: each process writes only its own shards
                               (__<rank>_0.distcp); one save per table bounds the memory a save needs (below)
    ROOT/step_000000080/       ...the newest --keep_checkpoints are kept; the last one is the final checkpoint

A checkpoint is written into a temporary sibling directory (``recsys_common.io.atomic_directory``), every file
fsync'd, and renamed into place only when complete; meta.json is written last. A crash (SIGKILL, preemption) mid-write
leaves only a ``.step_*.tmp-*`` directory, which is ignored and removed by the next save.

Tables are saved shard by shard: a TorchRec ``ShardedTensor`` writes just the rows and columns of this process's
shards (no process ever holds a whole table it does not own), plain tables are written once (DCP deduplicates
replicated tensors). DCP holds a CPU copy of each item it writes until its save ends (FBGEMM keeps all tables in one
buffer, and a view of it is copied), hence one save per table: the extra memory is one table's local shard.
Loading reshards: each process reads just the parts of the files that overlap its own shards,
so a checkpoint saved by N processes loads on M, table-wise or row-wise, TorchRec or plain ``EmbeddingBag`` tables.

Tables kept in files (``--embedding_memory_budget_gb`` with ``--embedding_storage_dir``, :mod:`dlrm.model.table_files`)
are not copied into ``model/``: the storage keeps the newest checkpoint's tables and an undo journal of the changes
since, and ``meta.json``'s ``table_storage`` names each process's storage, the generation and its token. Saving
prepares every storage (files synced, tables in RAM written) before the directory is written and commits the
generation after it is renamed into place; loading rolls the storage back to it, or reads the tables from it
unchanged into a model without files (``--mode test``, serving). Only the newest checkpoint's tables exist there.

DCP stores its index (``.metadata``) as a pickle; it is read here with an unpickler that accepts only DCP's own
metadata classes, so a checkpoint from elsewhere cannot run code (as ``torch.load(weights_only=True)`` for the rest).
"""
from __future__ import annotations

import io
import os
import pickle
import random
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import StorageMeta

from dlrm.model.table_files import TableStorageError, TieredTableEmbeddings, find_tiered, read_checkpoint_tables
from dlrm.utils.distributed import all_reduce_sum
from recsys_common import checkpoints as catalogue
from recsys_common.checkpoints import CheckpointError, checkpoint_name  # noqa: F401 (this recipe's names for them)
from recsys_common.io import atomic_directory
from recsys_common.shared_storage import DirectoryNotSharedError, check_shared_directory

FORMAT_VERSION = 2
MARKER = "meta.json"  # the manifest, written last: a step_<N> holding it is complete (recsys_common.checkpoints)
# Model configuration fields that must match to load a checkpoint (a mismatch is refused, naming every field).
CONFIG_FIELDS = ("num_numerical_features", "table_sizes", "embedding_dim", "bottom_mlp_sizes", "top_mlp_sizes",
                 "interaction_op", "self_interaction", "hash_indices", "hotness", "dcn_num_layers",
                 "dcn_low_rank_dim")
CONFIG_FLAGS = {"table_sizes": "table sizes (dataset cardinalities or --max_table_size)",
                "num_numerical_features": "number of numerical features", "hotness": "the feature spec's hotness"}
# Training settings that may change on resume, with a warning (the run then no longer equals an uninterrupted one).
TRAINING_FIELDS = ("batch_size", "lr", "world_size")
VERSION_HINTS = {1: "whole tables as embeddings/<i>.npy, written by a release before sharded and periodic "
                    "checkpoints; use that release to evaluate it, or train anew"}


def _is_sharded(value: Any) -> bool:
    return hasattr(value, "local_shards") and hasattr(value, "metadata")


def _local_tensors(value: Any) -> List[torch.Tensor]:
    return [shard.tensor for shard in value.local_shards()] if _is_sharded(value) else [value]


# ------------------------------------------------------------------------------------------------ finding checkpoints
def list_checkpoints(root: str) -> List[Tuple[int, str]]:
    """Complete checkpoints (with meta.json) directly under ``root``, as ``(step, path)``, oldest first."""
    return catalogue.list_checkpoints(root, MARKER)


def resolve_checkpoint(path: str) -> str:
    """``path`` itself when it is one checkpoint, else the newest complete checkpoint under it."""
    return catalogue.resolve_checkpoint(path, MARKER)


def read_meta(path: str) -> Dict[str, Any]:
    return catalogue.read_marker(path, MARKER, FORMAT_VERSION, version_hints=VERSION_HINTS)


def check_config(meta: Dict[str, Any], config: Dict[str, Any], where: str) -> None:
    """Refuse a checkpoint of a differently shaped or configured model, naming every differing field."""
    catalogue.check_config(meta.get("config", {}), config, os.path.join(where, MARKER), CONFIG_FLAGS, CONFIG_FIELDS)


def warn_training_changes(meta: Dict[str, Any], training: Dict[str, Any], where: str) -> None:
    catalogue.warn_training_changes(meta.get("training", {}), training, TRAINING_FIELDS, where,
                                    " (batch order and learning rate schedule follow the new values)", stacklevel=4)


# ------------------------------------------------------------------------------------------- state <-> DCP state dict
def _table_storage(trainable) -> Optional[TieredTableEmbeddings]:
    """The model's tables kept in an ``--embedding_storage_dir`` (saved there, not in the checkpoint), or None."""
    tiered = find_tiered(trainable.core)
    return tiered if tiered is not None and tiered.storage_dir is not None else None


def _stored_prefix(trainable) -> Optional[str]:
    """The state dict prefix of the tables kept in a storage (``embeddings.``), or None."""
    tiered = _table_storage(trainable)
    if tiered is None:
        return None
    for name, module in trainable.core.named_modules():
        if module is tiered:
            return f"{name}."
    raise CheckpointError("the model's tables in files are not a part of its core module: cannot tell their state")


def _state_outside_storage(trainable) -> Dict[str, Any]:
    """The model's state dict less the tables kept in a storage."""
    state, prefix = trainable.state_dict(), _stored_prefix(trainable)
    return state if prefix is None else {key: value for key, value in state.items() if not key.startswith(prefix)}


def _tensor_state(trainable, with_stored_tables: bool = False) -> Dict[str, Any]:
    """Tensors to save/load through DCP, under names independent of the embedding type and wrappers. The tables kept
    in a storage are not among them (checkpoints leave them there) unless ``with_stored_tables`` (loading a
    checkpoint that holds them into a storage)."""
    prefix = None if with_stored_tables else _stored_prefix(trainable)
    state = trainable.state_dict() if with_stored_tables else _state_outside_storage(trainable)
    table_index = {key: i for i, key in enumerate(trainable.table_state_keys)
                   if prefix is None or not key.startswith(prefix)}
    missing = sorted(set(table_index) - set(state))
    if missing:
        raise CheckpointError(f"model state has no embedding table(s) {missing}")
    out: Dict[str, Any] = {}
    for key, value in state.items():
        out[f"tables/{table_index[key]}" if key in table_index else f"dense/{key}"] = value
    return out


def _fused_optimizer_state(trainable) -> Dict[str, Any]:
    """The fused (TorchRec) optimizer's per-table state tensors, sharded like the tables, keyed by table index."""
    table_index = {key: i for i, key in enumerate(trainable.table_state_keys)}
    fused_state = trainable.embedding_optimizer.state_dict().get("state", {})
    out = {}
    for param_key, entries in fused_state.items():
        canonical = _canonical_key(param_key)
        if canonical not in table_index:
            continue
        for name, value in entries.items():
            if torch.is_tensor(value) or _is_sharded(value):
                out[f"embedding_optimizer/{table_index[canonical]}/{name}"] = value
    return out


def _canonical_key(key: str) -> str:
    for prefix in ("_dmp_wrapped_module.", "module."):
        while key.startswith(prefix):
            key = key[len(prefix):]
    return key


def _split_torch_optimizer(optimizer) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """A torch optimizer's state as (large per-table tensors for DCP, the rest for dense.pt)."""
    state = optimizer.state_dict()
    tensors, small = {}, {"param_groups": state["param_groups"], "state": {}}
    for index, entries in state["state"].items():
        small["state"][index] = {}
        for name, value in entries.items():
            if torch.is_tensor(value) and value.dim() > 0:
                tensors[f"embedding_optimizer/{index}/{name}"] = value
                small["state"][index][name] = None  # placeholder: the tensor is in model/
            else:
                small["state"][index][name] = value
    return tensors, small


# ----------------------------------------------------------------------------------------------------------- saving
def all_finite(trainable) -> bool:
    """Whether every weight this process holds (its shards) is finite; agreed over processes. Of the tables kept in a
    storage only the rows changed since the last checkpoint are read."""
    flags = [_finite(t) for value in _state_outside_storage(trainable).values() for t in _local_tensors(value)
             if torch.is_tensor(t) and t.is_floating_point()]
    tiered = _table_storage(trainable)
    if tiered is not None:
        flags.append(tiered.changed_rows_finite())
    ok = torch.stack(flags).all() if flags else torch.tensor(True)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        ok = ok.to(torch.int32)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def _finite(tensor: torch.Tensor, chunk_elements: int = 1 << 22) -> torch.Tensor:
    """isfinite(tensor).all() as a device bool, in row blocks: no table-sized temporary at save time."""
    if tensor.dim() == 0:
        return torch.isfinite(tensor)
    rows = max(1, chunk_elements // max(1, tensor[0].numel()))
    return torch.stack([torch.isfinite(block).all() for block in tensor.split(rows)]).all() if len(tensor) else \
        torch.ones((), dtype=torch.bool, device=tensor.device)


def save_checkpoint(root: str, trainable, config: Dict[str, Any], position: Dict[str, Any], rank: int,
                    world_size: int, scaler=None, training: Optional[Dict[str, Any]] = None,
                    keep: Optional[int] = None) -> str:
    """Collective: every process calls it. Writes ``root/step_<global_step>`` atomically; returns its path.

    ``keep``: afterwards remove all but the newest ``keep`` checkpoints under ``root`` (only ``step_<N>``
    directories, never other files). Raises ``FloatingPointError`` instead of saving non-finite weights.
    """
    if not all_finite(trainable):
        raise FloatingPointError(f"the weights at step {position.get('global_step')} are NaN or infinite; not "
                                 f"saving them over the last good checkpoint in {root}")
    path = os.path.join(root, checkpoint_name(int(position["global_step"])))
    tensors = _tensor_state(trainable)
    small_embedding_optimizer = None
    optimizer = trainable.embedding_optimizer
    optimizer_kind = None
    if optimizer is not None:
        if trainable.embedding_type == "torchrec_fused":
            optimizer_kind = "fused"
            tensors.update(_fused_optimizer_state(trainable))
        else:
            optimizer_kind = "torch"
            big, small_embedding_optimizer = _split_torch_optimizer(optimizer)
            tensors.update(big)
    rng_states = _gather(_rng_state(), world_size)
    tiered = _table_storage(trainable)
    storage_records = _prepare_storages(tiered, world_size) if tiered is not None else None
    group = dist.is_available() and dist.is_initialized()
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        catalogue.remove_stale_temporaries(root)
        context = atomic_directory(path, overwrite=True)
        tmp = context.__enter__()
    else:
        context, tmp = None, None
    try:
        if group and world_size > 1:
            holder = [tmp]
            dist.broadcast_object_list(holder, src=0)  # every process writes its shards into rank 0's temp dir
            tmp = holder[0]
        # DCP: each process writes its own shards (fsync'd: sync_files), rank 0 the index, after all wrote. One save
        # per table: DCP keeps a CPU copy of every item it wrote until the save ends (a view into FBGEMM's one
        # buffer of all tables is copied), so per table that extra memory is one table's local shard, not all.
        for group, members in _groups(tensors).items():
            dcp.save(members, storage_writer=dcp.FileSystemWriter(os.path.join(tmp, "model", group),
                                                                  sync_files=True))
        if rank == 0:
            torch.save({
                "dense_optimizer": trainable.dense_optimizer.state_dict(),
                "embedding_optimizer": small_embedding_optimizer,
                "scaler": scaler.state_dict() if scaler is not None else None,
            }, os.path.join(tmp, "dense.pt"))
            torch.save({"per_rank": rng_states}, os.path.join(tmp, "rng.pt"))
            meta = {"format_version": FORMAT_VERSION, "config": config, "position": position,
                    "world_size": world_size, "training": dict(training or {}, world_size=world_size),
                    "embedding_type": trainable.embedding_type, "num_tables": len(trainable.table_state_keys),
                    "embedding_optimizer": optimizer_kind, "saved_at": time.time()}
            if storage_records is not None:
                meta["table_storage"] = storage_records
            catalogue.write_marker(tmp, MARKER, meta)  # last: its presence marks a complete one
    except BaseException as e:
        if context is not None:
            context.__exit__(type(e), e, e.__traceback__)
        raise
    if context is not None:
        context.__exit__(None, None, None)  # fsyncs every file (all ranks' shards) and directory, renames into place
        if keep:
            prune_checkpoints(root, keep)
    _barrier()
    if tiered is not None:   # the checkpoint is in place on every process's view: its tables become the storage's
        tiered.commit(storage_records[0]["generation"])
    return path


def _prepare_storages(tiered: TieredTableEmbeddings, world_size: int) -> List[Dict[str, Any]]:
    """Collective: every process prepares its storage for the next generation (its files synced, its tables in RAM
    written); the records of all, in rank order. A failure on any process (a full disk) raises on every process,
    before the checkpoint is written: the previous one stays whole."""
    try:
        outcome = {"record": tiered.prepare_commit(tiered.generation + 1), "failure": None}
    except (TableStorageError, OSError) as error:
        outcome = {"record": None, "failure": str(error)}
    outcomes = _gather(outcome, world_size)
    failures = [o["failure"] for o in outcomes if o["failure"]]
    if failures:
        raise TableStorageError("checkpoint not written: " + "; ".join(failures))
    return [o["record"] for o in outcomes]


def prune_checkpoints(root: str, keep: int) -> List[str]:
    """Remove all but the newest ``keep`` complete checkpoints under ``root``; returns the removed paths."""
    return [path for _, path in catalogue.prune_checkpoints(root, keep, MARKER)]


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _gather(obj: Any, world_size: int) -> List[Any]:
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        out: List[Any] = [None] * world_size
        dist.all_gather_object(out, obj)
        return out
    return [obj]


# ----------------------------------------------------------------------------------------------------------- RNG
def _rng_state() -> Dict[str, Any]:
    """This process's random states as tensors and numbers (loadable with weights_only=True)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                       "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
             "python": {"version": int(py_state[0]), "state": torch.tensor(py_state[1], dtype=torch.int64),
                        "gauss_next": py_state[2]}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["cached_gaussian"]))
    python = state["python"]
    random.setstate((python["version"], tuple(int(v) for v in python["state"].tolist()), python["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ----------------------------------------------------------------------------------------------------------- loading
_DCP_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata", "ChunkStorageMetadata",
        "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
     ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
     ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` index only: DCP's dataclasses, torch dtypes and sizes, nothing callable."""

    def find_class(self, module: str, name: str):
        if (module, name) in _DCP_METADATA_CLASSES or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                          torch.dtype)):
            return super().find_class(module, name)
        raise CheckpointError(f"checkpoint index refers to {module}.{name}, which a checkpoint index never holds; "
                              f"refusing to load it (a tampered or foreign file?)")


def _safe_reader(path: str):
    metadata_file = os.path.join(path, ".metadata")

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            if not os.path.isfile(metadata_file):
                raise CheckpointError(f"{metadata_file}: missing (an incomplete checkpoint?)")
            with open(metadata_file, "rb") as f:
                metadata = _MetadataUnpickler(io.BytesIO(f.read())).load()
            for info in (metadata.storage_data or {}).values():
                relative = str(info.relative_path)
                if os.path.basename(relative) != relative or relative in ("", ".", ".."):
                    raise CheckpointError(f"{metadata_file}: data file {relative!r} is outside the checkpoint")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(path)


def _groups(tensors: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Split names into DCP saves: ``dense`` (MLPs) and ``table_<i>`` (table i and its optimizer state); the same
    order on every process, as each save is collective."""
    groups: Dict[str, Dict[str, Any]] = {}
    for key in sorted(tensors, key=_group_order):
        groups.setdefault(_group_of(key), {})[key] = tensors[key]
    return groups


def _group_of(key: str) -> str:
    parts = key.split("/")
    return f"table_{parts[1]}" if parts[0] in ("tables", "embedding_optimizer") else "dense"


def _group_order(key: str) -> tuple:
    group = _group_of(key)
    return (-1 if group == "dense" else int(group.split("_")[1]), key)


def _saved_shapes(path: str) -> Dict[str, Tuple[Tuple[int, ...], Any]]:
    """Name -> (shape, dtype) of every tensor in a checkpoint's DCP indexes (``model/<group>/.metadata``)."""
    model = os.path.join(path, "model")
    if not os.path.isdir(model):
        raise CheckpointError(f"{model}: missing (an incomplete checkpoint?)")
    out = {}
    for group in sorted(os.listdir(model)):
        metadata = _safe_reader(os.path.join(model, group)).read_metadata()
        for key, md in metadata.state_dict_metadata.items():
            if hasattr(md, "size"):
                if _group_of(key) != group:
                    raise CheckpointError(f"{model}/{group}/.metadata: holds {key!r}, which belongs in "
                                          f"{_group_of(key)}")
                out[key] = (tuple(md.size), md.properties.dtype)
    return out


def load_checkpoint(path: str, trainable, scaler=None, load_optimizer: bool = True,
                    config: Optional[Dict[str, Any]] = None, training: Optional[Dict[str, Any]] = None,
                    rank: int = 0, world_size: int = 1) -> Dict[str, Any]:
    """Load checkpoint ``path`` (one checkpoint, or a directory of them: the newest) into ``trainable``.

    Any process count, any embedding type. ``config``: refuse a different model configuration (names the field);
    ``training``: warn about a changed batch size, learning rate or world size. With ``load_optimizer`` (resuming
    training) also the optimizers, the loss scaler and every process's RNG state. Returns ``meta.json``, with
    ``meta["path"]`` the checkpoint loaded.
    """
    path = resolve_checkpoint(path)
    meta = read_meta(path)
    if config is not None:
        check_config(meta, config, path)
    if training is not None:
        warn_training_changes(meta, dict(training, world_size=world_size), path)
    if meta["num_tables"] != len(trainable.table_state_keys):
        raise CheckpointError(f"{path}/meta.json: {meta['num_tables']} embedding tables in the checkpoint, the model "
                              f"has {len(trainable.table_state_keys)}")
    from_storages = _load_table_storages(path, meta, trainable, load_optimizer, rank, world_size)
    saved = _saved_shapes(path)
    targets = _tensor_state(trainable, with_stored_tables=not meta.get("table_storage"))
    for key in list(targets):
        if key in from_storages:   # tables read from the checkpoint's storages, into a model without one
            _copy_checked(targets.pop(key), from_storages[key], f"{path} ({key}, from its table storage)")
    for key, value in targets.items():
        shape = tuple(value.size()) if _is_sharded(value) else tuple(value.shape)
        if key not in saved:
            raise CheckpointError(f"{path}/model: no tensor {key!r} (checkpoint of a different model?)")
        if saved[key][0] != shape:
            raise CheckpointError(f"{path}/model: {key} has shape {saved[key][0]} in the checkpoint, but the model has "
                                  f"{shape} (a different --embedding_dim, table size or MLP size?)")
    dense_path = os.path.join(path, "dense.pt")
    payload = torch.load(dense_path, map_location="cpu", weights_only=True) if load_optimizer else None
    small_optimizer = None
    if load_optimizer and trainable.embedding_optimizer is not None:
        kind = "fused" if trainable.embedding_type == "torchrec_fused" else "torch"
        if meta.get("embedding_optimizer") == kind:
            if kind == "fused":
                optimizer_targets = _fused_optimizer_state(trainable)
            else:
                small_optimizer = payload.get("embedding_optimizer")
                optimizer_targets = {key: torch.zeros(shape, dtype=dtype) for key, (shape, dtype) in saved.items()
                                     if key.startswith("embedding_optimizer/")}
            for key, value in optimizer_targets.items():
                if key in saved:
                    targets[key] = value
        elif meta.get("embedding_optimizer"):
            warnings.warn(f"{path}: embedding optimizer state of a {meta.get('embedding_optimizer')} optimizer cannot "
                          f"be loaded into --embedding_type {trainable.embedding_type}; starting its state afresh",
                          stacklevel=2)
    with torch.no_grad():  # collective when a process group exists; each process reads what overlaps its shards
        for group, members in _groups(targets).items():
            dcp.load(members, storage_reader=_safe_reader(os.path.join(path, "model", group)))
    if load_optimizer:
        trainable.dense_optimizer.load_state_dict(payload["dense_optimizer"])
        if scaler is not None and payload.get("scaler"):
            scaler.load_state_dict(payload["scaler"])
        if small_optimizer is not None:
            for index, entries in small_optimizer["state"].items():
                for name in entries:
                    if entries[name] is None:
                        entries[name] = targets[f"embedding_optimizer/{index}/{name}"]
            trainable.embedding_optimizer.load_state_dict(small_optimizer)
        _restore_rng(path, rank, world_size)
    meta["path"] = path
    return meta


def _load_table_storages(path: str, meta: Dict[str, Any], trainable, load_optimizer: bool, rank: int,
                         world_size: int) -> Dict[str, torch.Tensor]:
    """The part of loading checkpoint ``path`` that concerns tables kept in storages (``meta["table_storage"]``).

    A model with its own storage restores it to the checkpoint's generation (the same storage, one per process, so
    the same number of processes). A model without one reads the tables from the storages, unchanged (evaluation,
    serving), returned as ``{state key: tensor}``. A model with a storage loading a checkpoint without one: the
    tables come from the checkpoint, into a storage no other checkpoint refers to."""
    records = meta.get("table_storage")
    tiered = _table_storage(trainable)
    if not records:
        if tiered is not None:
            tiered.check_overwritable(path)
        return {}
    if tiered is None:
        if load_optimizer:
            raise CheckpointError(f"{path}: its tables are kept in {_storage_dirs(records)}; resume it with "
                                  f"--embedding_memory_budget_gb and the same --embedding_storage_dir")
        return _stored_tables_by_key(trainable, read_checkpoint_tables(records, path))
    if len(records) != world_size:
        raise CheckpointError(f"{path}: saved by {len(records)} processes, each with its tables in its own storage "
                              f"({_storage_dirs(records)}); resume it with {len(records)} processes, not {world_size}")
    record = records[rank]
    if os.path.realpath(record["storage_dir"]) != os.path.realpath(tiered.storage_dir):
        raise TableStorageError(f"{path}: its tables are in {record['storage_dir']}, this run's table storage is "
                                f"{tiered.storage_dir}: give the checkpoint's --embedding_storage_dir")
    for field in ("table_sizes", "embedding_dim", "in_files", "adagrad"):
        if record[field] != getattr(tiered, field):
            raise CheckpointError(f"{path}/{MARKER}: the tables of process {rank} were saved with {field} "
                                  f"{record[field]}, this run has {getattr(tiered, field)} (another "
                                  f"--embedding_memory_budget_gb, --adagrad or model)")
    tiered.restore(record["generation"], record["token"], checkpoint=path)
    return {}


def _storage_dirs(records: List[Dict[str, Any]]) -> str:
    return ", ".join(record["storage_dir"] for record in records)


def _stored_tables_by_key(trainable, tables: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Tables read from storages (``tables/<t>``, ``tables/<t>/adagrad_sum``) under the keys of
    :func:`_tensor_state` of a model without a storage (an accumulator is a buffer of its table there)."""
    out = {key: value for key, value in tables.items() if key.count("/") == 1}
    for index, key in enumerate(trainable.table_state_keys):
        accumulator = tables.get(f"tables/{index}/adagrad_sum")
        if accumulator is not None and key.endswith(".weight"):
            out[f"dense/{key[:-len('weight')]}adagrad_sum"] = accumulator
    return out


def _copy_checked(target: Any, source: torch.Tensor, where: str) -> None:
    """Copy a whole table into ``target``: a tensor, or a ``ShardedTensor`` (this process's shards of it)."""
    shape = tuple(target.size()) if _is_sharded(target) else tuple(target.shape)
    if shape != tuple(source.shape):
        raise CheckpointError(f"{where}: shape {tuple(source.shape)} in the checkpoint, the model has {shape} (a "
                              f"different --embedding_dim or table size?)")
    with torch.no_grad():
        if not _is_sharded(target):
            target.copy_(source)
            return
        for shard in target.local_shards():
            block = tuple(slice(offset, offset + size) for offset, size in
                          zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))
            shard.tensor.copy_(source[block])


def _restore_rng(path: str, rank: int, world_size: int) -> None:
    rng_path = os.path.join(path, "rng.pt")
    if not os.path.isfile(rng_path):
        raise CheckpointError(f"{rng_path}: missing (an incomplete checkpoint?)")
    per_rank = torch.load(rng_path, map_location="cpu", weights_only=True)["per_rank"]
    if len(per_rank) != world_size:
        warnings.warn(f"{rng_path}: saved by {len(per_rank)} processes, restored on {world_size}: process r takes "
                      f"the RNG state of saved process r % {len(per_rank)}", stacklevel=3)
    _set_rng_state(per_rank[rank % len(per_rank)])


# ------------------------------------------------------------------------------------------------ periodic saving
def check_shared_root(root: str, rank: int, world_size: int, device: torch.device) -> None:
    """Collective, before training: every process must see ``root`` (one node, or a file system shared by the
    nodes), since each writes its shards into rank 0's staging directory; raises :class:`CheckpointError` on every
    rank otherwise (``recsys_common.shared_storage``)."""

    def broadcast(text: str) -> str:
        holder = [text]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]
    try:
        check_shared_directory(root, rank, world_size, broadcast,
                               lambda flag: int(all_reduce_sum([1.0 if flag else 0.0], device)[0]))
    except DirectoryNotSharedError as e:
        raise CheckpointError(str(e)) from None


class CheckpointSaver:
    """Saves checkpoints under ``root`` during training: every ``every_steps`` steps and/or ``every_minutes``
    (``recsys_common.checkpoints.SavePolicy``).

    All processes must agree on when to save (a save is collective). The step rule is the same everywhere; the clock
    differs per process, so with several processes the minutes rule is decided every ``TIME_CHECK_EVERY`` steps by an
    all-reduce of one number (any process late; no host sync per step), and checked every step in a single process.
    """
    TIME_CHECK_EVERY = 16

    def __init__(self, root: str, trainable, config: Dict[str, Any], training: Dict[str, Any], rank: int,
                 world_size: int, device: torch.device, scaler=None, every_steps: Optional[int] = None,
                 every_minutes: Optional[float] = None, keep: int = 2):
        def any_late(late: bool) -> bool:
            return all_reduce_sum([1.0 if late else 0.0], device)[0] > 0
        self.policy = catalogue.SavePolicy(every_steps, every_minutes, keep, world_size, any_late,
                                           self.TIME_CHECK_EVERY)
        self.root, self.trainable, self.config, self.training = root, trainable, config, training
        self.rank, self.world_size, self.device, self.scaler = rank, world_size, device, scaler
        self.every_steps, self.every_minutes, self.keep = every_steps, every_minutes, keep
        self.last_step: Optional[int] = None
        self.last_path: Optional[str] = None

    def due(self, global_step: int) -> bool:
        return self.policy.due(global_step)

    def save(self, position: Dict[str, Any]) -> str:
        """Collective. Saves ``position`` (skipped when this step is already saved); returns the checkpoint path."""
        if position["global_step"] == self.last_step:
            return self.last_path
        self.last_path = save_checkpoint(self.root, self.trainable, self.config, position, self.rank,
                                         self.world_size, self.scaler, self.training, self.keep)
        self.last_step = position["global_step"]
        self.policy.saved()
        return self.last_path


def open_saver(root: Optional[str], every_steps: Optional[int], every_minutes: Optional[float], keep: int, ctx,
               trainable, scaler, config: Dict[str, Any], training: Dict[str, Any],
               resumed_from: Optional[str]) -> Optional[CheckpointSaver]:
    """The :class:`CheckpointSaver` of a training run saving under ``root`` (--save_checkpoint_path), else None
    (checking the flags). ``ctx``: the run's ``DistributedContext``; ``resumed_from``: the checkpoint it resumed."""
    if not root:
        if every_steps is not None or every_minutes is not None:
            raise ValueError("--checkpoint_every_steps/--checkpoint_every_minutes need --save_checkpoint_path")
        return None
    # First, and on every rank: a multi-node job needs the directory on a shared file system.
    check_shared_root(root, ctx.rank, ctx.world_size, ctx.device)
    existing = list_checkpoints(root)
    # Checkpoints of another run in the same directory would interleave with ours, and resuming from the directory
    # would pick whichever has the highest step: only the run resumed from the newest of them may add to it.
    if existing and (resumed_from is None or os.path.realpath(resumed_from) != os.path.realpath(existing[-1][1])):
        raise CheckpointError(
            f"{root}: already holds checkpoints of another run (newest: {existing[-1][1]}); pass "
            f"--load_checkpoint_path {root} to resume that run, or choose a new --save_checkpoint_path")
    saver = CheckpointSaver(root, trainable, config, training, ctx.rank, ctx.world_size, ctx.device, scaler,
                            every_steps, every_minutes, keep)
    if existing:  # resumed from the newest checkpoint here: its step is saved already
        saver.last_step, saver.last_path = existing[-1][0], existing[-1][1]
    return saver


def read_tensors(path: str) -> Dict[str, torch.Tensor]:
    """Every tensor of checkpoint ``path`` (or the newest under it), whole, in this process (for tools and tests:
    it allocates whole tables). Names: ``dense/<module key>``, ``tables/<i>``, ``embedding_optimizer/<i>/<name>``,
    and ``tables/<i>/adagrad_sum`` for tables kept in a storage."""
    path = resolve_checkpoint(path)
    meta = read_meta(path)
    out = {key: torch.empty(shape, dtype=dtype) for key, (shape, dtype) in _saved_shapes(path).items()}
    for group, members in _groups(out).items():
        dcp.load(members, storage_reader=_safe_reader(os.path.join(path, "model", group)), no_dist=True)
    if meta.get("table_storage"):   # and the tables kept in storages: ``tables/<i>``, ``tables/<i>/adagrad_sum``
        out.update(read_checkpoint_tables(meta["table_storage"], path))
    return out
