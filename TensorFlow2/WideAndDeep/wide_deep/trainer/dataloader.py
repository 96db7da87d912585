"""Batches of the preprocessed parquet files with the Merlin dataloader, sharded across Horovod ranks.

    spec = read_feature_spec(dataset_path, fspec_file)
    config_inputs = input_description(spec)           # one-hot / multi-hot / numerical names and sizes
    batches = ParquetBatches(spec, "train", batch_size=global_batch // world, rank=r, world_size=w, ...)
    for features, labels, display_ids in batches: ...

Each batch: ``features`` a dict (one-hot ``[B]`` int32, multi-hot ``[B, max_hotness]`` int32 padded with -1,
numerical ``[B]`` float32), ``labels`` ``[B]`` float32, ``display_ids`` ``[B]`` int64 (zeros when the spec has
no ``map`` channel). Rank ``r`` of ``w`` reads its contiguous share of the parquet partitions
(``merlin.dataloader``'s ``global_rank``/``global_size``), so there must be at least ``w`` partitions (files).
"""
from __future__ import annotations

import os
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from recsys_common.feature_spec import FeatureSpec

ONEHOT_CHANNEL = "onehot_categorical"
MULTIHOT_CHANNEL = "multihot_categorical"
NUMERICAL_CHANNEL = "numerical"
LABEL_CHANNEL = "label"
MAP_CHANNEL = "map"


class DataError(ValueError):
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
    import pyarrow.parquet as pq
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
    import pyarrow.parquet as pq
    return sum(pq.read_metadata(f).num_rows for f in files)


class ParquetBatches:
    """Iterable of ``(features, labels, display_ids)`` batches of one rank's shard (see the module docstring).

    ``drop_last``: drop the rank's last partial batch (training: equal batch sizes on every rank).
    ``seed``: shuffle seed, the same on every rank; the epoch number is added at each new iteration.
    """

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, rank: int = 0, world_size: int = 1,
                 shuffle: bool = False, seed: int = 0, drop_last: bool = False):
        import merlin.io
        from merlin.dataloader.tensorflow import Loader
        if batch_size < 1:
            raise DataError(f"batch size per rank must be at least 1, got {batch_size}")
        self.description = input_description(spec)
        self.files = mapping_files(spec, mapping)
        self.mapping = mapping
        self.origin = spec.origin
        self.num_rows = count_rows(self.files)
        if self.num_rows == 0:
            raise DataError(f"mapping '{mapping}' of {spec.origin} has no rows ({', '.join(self.files)})")
        columns = ([self.description["label"]] + ([self.description["map"]] if self.description["map"] else [])
                   + list(self.description["onehot"]) + list(self.description["multihot"])
                   + list(self.description["numerical"]))
        dataset = merlin.io.Dataset(self.files, engine="parquet", cpu=not tf.config.list_physical_devices("GPU"))
        if dataset.npartitions < world_size:
            raise DataError(f"mapping '{mapping}' of {spec.origin} has {dataset.npartitions} parquet partition(s) "
                            f"for {world_size} ranks: write at least {world_size} files")
        self._epoch = 0
        self._seed = seed
        missing = [c for c in columns if c not in dataset.schema.column_names]
        if missing:
            raise DataError(f"mapping '{mapping}' of {spec.origin}: column {missing[0]!r} is not in its parquet files")
        self.loader = Loader(dataset, batch_size=batch_size, shuffle=shuffle, global_size=world_size, global_rank=rank,
                             drop_last=drop_last, seed_fn=lambda: self._seed + self._epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def _pad(self, features: Dict[str, tf.Tensor], name: str) -> tf.Tensor:
        hotness = self.description["max_hotness"][name]
        values, offsets = features.pop(f"{name}__values"), features.pop(f"{name}__offsets")
        lengths = offsets[1:] - offsets[:-1]
        longest = int(tf.reduce_max(lengths)) if lengths.shape[0] else 0
        if longest > hotness:
            raise DataError(f"multi-hot column {name!r} of mapping '{self.mapping}' ({', '.join(self.files)}) has a "
                            f"list of {longest} ids, longer than its max_hotness {hotness} in {self.origin}")
        ragged = tf.RaggedTensor.from_row_splits(tf.cast(values, tf.int32), offsets)
        return ragged.to_tensor(default_value=-1, shape=[None, hotness])

    def __iter__(self) -> Iterator[Tuple[Dict[str, tf.Tensor], tf.Tensor, tf.Tensor]]:
        d = self.description
        for features, _ in self.loader:
            features = dict(features)
            labels = tf.cast(features.pop(d["label"]), tf.float32)
            display = features.pop(d["map"]) if d["map"] else tf.zeros_like(labels, tf.int64)
            for name in d["multihot"]:
                if f"{name}__values" in features:
                    features[name] = self._pad(features, name)
                else:  # a list column stored flat (hotness 1)
                    features[name] = tf.cast(features[name], tf.int32)[:, None]
            for name in d["onehot"]:
                features[name] = tf.cast(tf.reshape(features[name], [-1]), tf.int32)
            for name in d["numerical"]:
                features[name] = tf.cast(tf.reshape(features[name], [-1]), tf.float32)
            yield features, labels, tf.cast(tf.reshape(display, [-1]), tf.int64)
        self._epoch += 1
