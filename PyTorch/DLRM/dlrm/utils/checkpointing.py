"""Checkpoints that do not depend on the number of processes or the embedding implementation.

A checkpoint is a directory, written under a temporary name and renamed into place only when complete
(``recsys_common.io.atomic_directory``), so a crash never leaves a half-written checkpoint:

    meta.json                 format version, model config, training position (epoch, step), world size at save
    dense.pt                  MLP weights, dense-optimizer state, loss-scaler state, RNG states (torch.save;
                              loaded with weights_only=True)
    embeddings/<i>.npy        table i, whole, float32 [rows, dim] (np.save; loaded memory-mapped)
    embedding_optimizer.pt    per-table optimizer state when there is any (Adam moments), whole tables

Sharded tables (TorchRec ``ShardedTensor``) are assembled from their shards by a sum-reduce to rank 0 (shards are
disjoint, the rest is zeros), and on load every process copies just the rows and columns of its own shards out of
the memory-mapped file. So a checkpoint saved by N processes loads on M, table-wise or row-wise, TorchRec or plain.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

import numpy as np
import torch
import torch.distributed as dist

from recsys_common.io import atomic_directory

FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete, or does not match the model; names the file."""


def _is_sharded(value: Any) -> bool:
    return hasattr(value, "local_shards") and hasattr(value, "metadata")


def _shard_slices(shard) -> tuple:
    return tuple(slice(o, o + s) for o, s in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))


def gather_full(value: Any, rank: int) -> Optional[torch.Tensor]:
    """The whole tensor on rank 0 (``None`` elsewhere); a collective for sharded tensors."""
    if not _is_sharded(value):
        return value.detach().to("cpu", torch.float32 if value.is_floating_point() else value.dtype)
    shards = value.local_shards()
    device = shards[0].tensor.device if shards else torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    full = torch.zeros(tuple(value.size()), dtype=torch.float32, device=device)
    for shard in shards:
        full[_shard_slices(shard)] = shard.tensor.to(device, torch.float32)
    dist.reduce(full, dst=0, op=dist.ReduceOp.SUM)
    return full.cpu() if rank == 0 else None


def load_into(target: Any, source: np.ndarray, where: str) -> None:
    """Copy ``source`` (whole tensor, maybe memory-mapped) into ``target`` (plain tensor or this rank's shards)."""
    shape = tuple(target.size()) if _is_sharded(target) else tuple(target.shape)
    if tuple(source.shape) != shape:
        raise CheckpointError(f"{where}: shape {tuple(source.shape)} in the checkpoint, but the model has {shape} "
                              f"(a different --embedding_dim, table size or MLP size?)")
    with torch.no_grad():
        if _is_sharded(target):
            for shard in target.local_shards():
                block = np.array(source[_shard_slices(shard)], dtype=np.float32)
                shard.tensor.copy_(torch.from_numpy(block).to(shard.tensor.dtype))
        else:
            target.copy_(torch.from_numpy(np.array(source)).to(target.dtype))


def save_checkpoint(path: str, trainable, config: Dict[str, Any], position: Dict[str, Any], rank: int,
                    world_size: int, scaler=None) -> None:
    """Collective: every rank calls it; rank 0 writes ``path`` atomically."""
    state = trainable.state_dict()
    table_index = {key: i for i, key in enumerate(trainable.table_state_keys)}
    tables: Dict[int, torch.Tensor] = {}
    dense: Dict[str, torch.Tensor] = {}
    for key in sorted(state):  # same order on every rank: the gathers are collectives
        value = state[key]
        if key in table_index:
            full = gather_full(value, rank)
            if rank == 0:
                tables[table_index[key]] = full
        elif rank == 0:
            dense[key] = value.detach().cpu()
    missing = sorted(set(trainable.table_state_keys) - set(state))
    if missing:
        raise CheckpointError(f"model state has no embedding table(s) {missing}")
    embedding_optimizer_state = _embedding_optimizer_state(trainable, rank)
    if rank != 0:
        _barrier()
        return
    payload = {
        "model": dense,
        "dense_optimizer": trainable.dense_optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": {"torch": torch.get_rng_state()},
    }
    meta = {"format_version": FORMAT_VERSION, "config": config, "position": position, "world_size": world_size,
            "embedding_type": trainable.embedding_type, "num_tables": len(trainable.table_state_keys)}
    with atomic_directory(path, overwrite=True) as tmp:
        os.makedirs(os.path.join(tmp, "embeddings"))
        for i, table in tables.items():
            np.save(os.path.join(tmp, "embeddings", f"{i}.npy"), table.numpy(), allow_pickle=False)
        torch.save(payload, os.path.join(tmp, "dense.pt"))
        if embedding_optimizer_state:
            torch.save(embedding_optimizer_state, os.path.join(tmp, "embedding_optimizer.pt"))
        with open(os.path.join(tmp, "meta.json"), "w") as f:  # last: its presence marks a complete checkpoint
            json.dump(meta, f, indent=2, sort_keys=True)
    _barrier()


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _embedding_optimizer_state(trainable, rank: int) -> Dict[str, Any]:
    """Whole-table optimizer state: plain optimizers' state_dict, or the fused optimizer's sharded states gathered."""
    optimizer = trainable.embedding_optimizer
    if optimizer is None:
        return {}
    if trainable.embedding_type == "multi_table":
        state = optimizer.state_dict()
        return {"kind": "torch", "state": state} if state.get("state") else {}
    fused_state = optimizer.state_dict().get("state", {})
    out: Dict[str, Any] = {}
    for param_key in sorted(fused_state):
        for name in sorted(fused_state[param_key]):
            value = fused_state[param_key][name]
            if not torch.is_tensor(value) and not _is_sharded(value):
                continue
            full = gather_full(value, rank)
            if rank == 0:
                out[f"{param_key}/{name}"] = full
    return {"kind": "fused", "state": out} if out else {}


def read_meta(path: str) -> Dict[str, Any]:
    meta_path = os.path.join(path, "meta.json")
    if not os.path.isfile(meta_path):
        raise CheckpointError(f"{path}: not a complete checkpoint ({meta_path} is missing)")
    with open(meta_path) as f:
        meta = json.load(f)
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{meta_path}: checkpoint format {meta.get('format_version')}, this code reads "
                              f"{FORMAT_VERSION}")
    return meta


def load_checkpoint(path: str, trainable, scaler=None,
                    load_optimizer: bool = True) -> Dict[str, Any]:
    """Load ``path`` into ``trainable`` (any process count, any embedding type); returns ``meta.json``."""
    meta = read_meta(path)
    if meta["num_tables"] != len(trainable.table_state_keys):
        raise CheckpointError(f"{path}/meta.json: {meta['num_tables']} embedding tables in the checkpoint, the model "
                              f"has {len(trainable.table_state_keys)}")
    dense_path = os.path.join(path, "dense.pt")
    payload = torch.load(dense_path, map_location="cpu", weights_only=True)
    state = trainable.state_dict()
    table_index = {key: i for i, key in enumerate(trainable.table_state_keys)}
    for key, target in state.items():
        if key in table_index:
            file = os.path.join(path, "embeddings", f"{table_index[key]}.npy")
            if not os.path.isfile(file):
                raise CheckpointError(f"{file}: missing embedding table {table_index[key]}")
            load_into(target, np.load(file, mmap_mode="r", allow_pickle=False), file)
        else:
            if key not in payload["model"]:
                raise CheckpointError(f"{dense_path}: no tensor {key!r} (checkpoint of a different model?)")
            load_into(target, payload["model"][key].numpy(), f"{dense_path}:{key}")
    if load_optimizer:
        trainable.dense_optimizer.load_state_dict(payload["dense_optimizer"])
        if scaler is not None and payload.get("scaler"):
            scaler.load_state_dict(payload["scaler"])
        _load_embedding_optimizer(path, trainable)
    return meta


def _load_embedding_optimizer(path: str, trainable) -> None:
    file = os.path.join(path, "embedding_optimizer.pt")
    if not os.path.isfile(file) or trainable.embedding_optimizer is None:
        return
    saved = torch.load(file, map_location="cpu", weights_only=True)
    if saved["kind"] == "torch" and trainable.embedding_type == "multi_table":
        trainable.embedding_optimizer.load_state_dict(saved["state"])
    elif saved["kind"] == "fused" and trainable.embedding_type == "torchrec_fused":
        current = trainable.embedding_optimizer.state_dict().get("state", {})
        for key, value in saved["state"].items():
            param_key, name = key.split("/", 1)
            if param_key in current and name in current[param_key]:
                load_into(current[param_key][name], value.numpy(), f"{file}:{key}")
    else:
        import warnings
        warnings.warn(f"{file}: embedding optimizer state of a {saved['kind']} optimizer cannot be loaded into "
                      f"--embedding_type {trainable.embedding_type}; starting its state afresh", stacklevel=2)
