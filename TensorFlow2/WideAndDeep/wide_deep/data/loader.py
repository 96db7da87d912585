"""Batches of the preprocessed parquet files (our own pyarrow reader), sharded across Horovod ranks.

    spec = read_feature_spec(dataset_path, fspec_file)
    config_inputs = input_description(spec)           # one-hot / multi-hot / numerical names and sizes
    batches = ParquetBatches(spec, "train", batch_size=global_batch // world, rank=r, world_size=w, ...)
    for features, labels, display_ids in batches: ...

Each batch: ``features`` a dict (one-hot ``[B]`` int32, multi-hot ``[B, max_hotness]`` int32 padded with -1,
numerical ``[B]`` float32), ``labels`` ``[B]`` float32, ``display_ids`` ``[B]`` int64 (zeros when the spec has
no ``map`` channel). Rank ``r`` of ``w`` reads its contiguous share of the parquet partitions (one partition per
file: ``ceil(files / w)`` files a rank, the last ranks fewer), so there must be at least ``w`` files.

The batches are the ones ``merlin.dataloader.tensorflow.Loader`` (23.08; ``shuffle``, ``seed_fn = seed + epoch``,
``global_rank``/``global_size``, ``drop_last``) gave over ``merlin.io.Dataset`` of the same files, in the same
order, wherever the Dataset made one partition of each file (every file smaller than its partition size: 12.5 % of
the memory): the same rows, values and order, with or without shuffling. Memory: one file's rows when shuffling
(a partition is shuffled whole), a few row groups otherwise, plus ``prefetch`` batches.

The feature spec's side of it (:func:`read_feature_spec`, :func:`input_description`) imports no TensorFlow, so that
``wide_deep.cli`` settles a run's configuration before TensorFlow starts; the batches are TensorFlow tensors
(TensorFlow is imported by the first iteration).
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recsys_common.cli import InputError
from recsys_common.feature_spec import FeatureSpec
from recsys_common.prefetch import prefetched

if TYPE_CHECKING:
    import tensorflow as tf

ONEHOT_CHANNEL = "onehot_categorical"
MULTIHOT_CHANNEL = "multihot_categorical"
NUMERICAL_CHANNEL = "numerical"
LABEL_CHANNEL = "label"
MAP_CHANNEL = "map"


class DataError(InputError):
    """Input data that does not match its feature spec (the message names the file / column / flag)."""


def read_feature_spec(dataset_path: str, fspec_file: str) -> FeatureSpec:
    """The validated FeatureSpec at ``dataset_path/fspec_file`` (an absolute ``fspec_file`` is used as is)."""
    path = fspec_file if os.path.isabs(fspec_file) else os.path.join(dataset_path, fspec_file)
    return FeatureSpec.from_yaml(path)


def input_description(spec: FeatureSpec) -> Dict[str, object]:
    """``{"onehot": {name: card}, "multihot": {name: card}, "max_hotness": {name: h}, "numerical": [names],
    "label": name, "map": name or None}`` from the spec's channels."""
    ch = spec.channel_spec
    if not ch.get(LABEL_CHANNEL):
        raise DataError(f"{spec.origin}: channel_spec has no '{LABEL_CHANNEL}' channel")
    onehot = {n: spec.cardinality(n) for n in ch.get(ONEHOT_CHANNEL, [])}
    multihot = {n: spec.cardinality(n) for n in ch.get(MULTIHOT_CHANNEL, [])}
    return {"onehot": onehot, "multihot": multihot,
            "max_hotness": {n: spec.max_hotness(n) for n in multihot},
            "numerical": list(ch.get(NUMERICAL_CHANNEL, [])),
            "label": ch[LABEL_CHANNEL][0], "map": (ch.get(MAP_CHANNEL) or [None])[0]}


def mapping_files(spec: FeatureSpec, mapping: str) -> List[str]:
    """Absolute parquet files of ``mapping`` (``train`` or ``test``); checks each file's columns against the spec."""
    if mapping not in spec.source_spec:
        raise DataError(f"{spec.origin}: source_spec has no '{mapping}' mapping")
    files = []
    for chunk in spec.source_spec[mapping]:
        if chunk.get("type") != "parquet":
            raise DataError(f"{spec.origin}: mapping '{mapping}' has a chunk of type {chunk.get('type')!r}; "
                            "this recipe reads parquet (convert with transcode.py)")
        for rel in chunk["files"]:
            path = spec.resolve_file(rel)
            if not os.path.exists(path):
                raise DataError(f"{path}: file of mapping '{mapping}' in {spec.origin} does not exist")
            schema = pq.read_schema(path)
            missing = [f for f in chunk["features"] if f not in schema.names]
            if missing:
                raise DataError(f"{path}: column {missing[0]!r} of the feature spec ({spec.origin}) is missing; "
                                f"the file has {schema.names}")
            files.append(path)
    if not files:
        raise DataError(f"{spec.origin}: mapping '{mapping}' lists no files")
    return files


def count_rows(files: List[str]) -> int:
    return sum(pq.read_metadata(f).num_rows for f in files)


class ParquetBatches:
    """Iterable of ``(features, labels, display_ids)`` batches of one rank's shard (see the module docstring).

    ``drop_last``: drop the rank's last partial batch (training: equal batch sizes on every rank).
    ``seed``: shuffle seed, the same on every rank; the epoch number is added at each new iteration.
    ``prefetch``: batches prepared ahead by a background thread (0: none).
    """

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, rank: int = 0, world_size: int = 1,
                 shuffle: bool = False, seed: int = 0, drop_last: bool = False, prefetch: int = 2):
        if batch_size < 1:
            raise DataError(f"batch size per rank must be at least 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} is outside 0..{world_size - 1}")
        self.description = input_description(spec)
        self.files = mapping_files(spec, mapping)
        self.mapping = mapping
        self.origin = spec.origin
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.prefetch = prefetch
        self.num_rows = count_rows(self.files)
        if self.num_rows == 0:
            raise DataError(f"mapping '{mapping}' of {spec.origin} has no rows ({', '.join(self.files)})")
        if len(self.files) < world_size:
            raise DataError(f"mapping '{mapping}' of {spec.origin} has {len(self.files)} parquet partition(s) "
                            f"for {world_size} ranks: write at least {world_size} files")
        d = self.description
        wanted = set(d["onehot"]) | set(d["multihot"]) | set(d["numerical"])
        schema = pq.read_schema(self.files[0])
        missing = [c for c in [d["label"]] + ([d["map"]] if d["map"] else []) + sorted(wanted)
                   if c not in schema.names]
        if missing:
            raise DataError(f"mapping '{mapping}' of {spec.origin}: column {missing[0]!r} is not in its parquet files")
        # features in the files' column order, multi-hot ones last (the order the Merlin loader gave)
        self._scalar_features = [c for c in schema.names if c in wanted and c not in d["multihot"]]
        self._columns = [d["label"]] + ([d["map"]] if d["map"] else []) + self._scalar_features + list(d["multihot"])
        # rank r of w: the contiguous partitions [r * ceil(n / w), (r + 1) * ceil(n / w)) (merlin.dataloader's
        # global_rank / global_size: the last ranks may get fewer, or none)
        per_rank = math.ceil(len(self.files) / world_size)
        self.shard = self.files[rank * per_rank:(rank + 1) * per_rank]
        self.shard_rows = count_rows(self.shard)
        self._num_partitions = len(self.files)
        self._epoch = 0
        self._seed = seed

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads (its shuffle seed is ``seed + epoch``; a resumed run sets it)."""
        self._epoch = epoch

    def __len__(self) -> int:
        batches = -(-self.shard_rows // self.batch_size)
        if self.drop_last and self.shard_rows % self.batch_size:
            batches -= 1
        return batches

    # ------------------------------------------------------------------------------------------ reading
    def _arrays(self, table) -> Dict[str, np.ndarray]:
        """A pyarrow table of the shard -> numpy columns as the batches hold them (multi-hot padded with -1)."""
        d = self.description
        out = {"__label": table.column(d["label"]).to_numpy().astype(np.float32)}
        out["__display"] = (table.column(d["map"]).to_numpy().astype(np.int64) if d["map"]
                            else np.zeros(table.num_rows, np.int64))
        for name in self._scalar_features:
            dtype = np.float32 if name in d["numerical"] else np.int32
            out[name] = table.column(name).to_numpy().astype(dtype)
        for name in d["multihot"]:
            col = table.column(name).combine_chunks()
            hotness = d["max_hotness"][name]
            if not pa.types.is_list(col.type) and not pa.types.is_large_list(col.type):
                out[name] = col.to_numpy().astype(np.int32)[:, None]   # a list column stored flat (hotness 1)
                continue
            offsets = col.offsets.to_numpy().astype(np.int64)
            lengths = np.diff(offsets)
            longest = int(lengths.max()) if len(lengths) else 0
            if longest > hotness:
                raise DataError(f"multi-hot column {name!r} of mapping '{self.mapping}' ({', '.join(self.files)}) "
                                f"has a list of {longest} ids, longer than its max_hotness {hotness} in {self.origin}")
            values = col.flatten().to_numpy().astype(np.int32)
            padded = np.full((len(lengths), hotness), -1, dtype=np.int32)
            rows = np.repeat(np.arange(len(lengths)), lengths)
            padded[rows, np.arange(len(values)) - np.repeat(offsets[:-1] - offsets[0], lengths)] = values
            out[name] = padded
        return out

    def _parts(self) -> Iterator[Dict[str, np.ndarray]]:
        """The shard's rows, a partition (file) at a time when shuffling (a partition is shuffled whole, as the
        Merlin loader does), else streamed a few row groups at a time (the batches are the same either way)."""
        for path in self.shard:
            if self.shuffle:
                yield self._arrays(pq.read_table(path, columns=self._columns))
            else:
                f = pq.ParquetFile(path)
                for batch in f.iter_batches(batch_size=max(self.batch_size, 1 << 16), columns=self._columns):
                    yield self._arrays(pa.Table.from_batches([batch]))

    def _numpy_batches(self, rng: Optional[np.random.RandomState]) -> Iterator[Dict[str, np.ndarray]]:
        """merlin.dataloader's chunking: each partition is appended to the previous one's leftover rows, cut to a
        whole number of batches (the new leftover is the rest), shuffled whole with ``rng.permutation`` when
        shuffling, and split into batches; the last leftover (not shuffled) is the last batch unless drop_last."""
        B = self.batch_size
        spill: Optional[Dict[str, np.ndarray]] = None
        for part in self._parts():
            chunk = part if spill is None else {k: np.concatenate([spill[k], v]) for k, v in part.items()}
            n = len(chunk["__label"])
            cut = n // B * B
            spill = {k: v[cut:] for k, v in chunk.items()}
            if cut == 0:
                continue
            if rng is not None:
                order = rng.permutation(cut)
                chunk = {k: v[:cut][order] for k, v in chunk.items()}
            for start in range(0, cut, B):
                yield {k: v[start:start + B] for k, v in chunk.items()}
        if spill is not None and len(spill["__label"]) and not self.drop_last:
            yield spill

    def __iter__(self) -> Iterator[Tuple[Dict[str, tf.Tensor], tf.Tensor, tf.Tensor]]:
        import tensorflow as tf   # late on purpose: see the module docstring
        rng = None
        if self.shuffle:
            # the Merlin loader's draws: numpy's legacy generator seeded with seed + epoch shuffles the partition
            # indices (which only advances the stream: each rank's partitions stay as sharded), then permutes each
            # chunk's rows
            rng = np.random.RandomState(self._seed + self._epoch)
            rng.shuffle(np.arange(self._num_partitions))
        batches = self._numpy_batches(rng)
        if self.prefetch > 0:
            batches = prefetched(batches, depth=self.prefetch, name="parquet-batches")
        d = self.description
        for batch in batches:
            features = {name: tf.convert_to_tensor(batch[name]) for name in self._scalar_features}
            for name in d["multihot"]:
                features[name] = tf.convert_to_tensor(batch[name])
            yield features, tf.convert_to_tensor(batch["__label"]), tf.convert_to_tensor(batch["__display"])
        self._epoch += 1
