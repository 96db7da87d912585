"""The MovieLens example's data as its model reads it: the parquet parts that ``wide_deep.movielens.etl`` writes
(``train`` and ``test`` mappings of its ``feature_spec.yaml``), as numpy inputs (ids int32, the multi-hot genres
``[N, max_hotness]`` padded with -1, the label float32): a part (:func:`load_part`), a split (:func:`load_split`),
or endless shuffled training batches a part at a time (:func:`training_batches`, HugeCTR's non-epoch mode).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recsys_common.feature_spec import FeatureSpec

from ..movielens.etl import LABEL, MULTIHOT_CHANNEL, ONEHOT_CHANNEL


def part_files(spec: FeatureSpec, mapping: str) -> List[str]:
    """The parquet parts of one split (``wide_deep.movielens.etl`` writes one per ``--part_rows`` ratings)."""
    files = []
    for chunk in spec.source_spec.get(mapping, []):
        if chunk.get("type") != "parquet":
            raise ValueError(f"{spec.origin}: mapping {mapping!r} has a {chunk.get('type')!r} chunk; "
                             f"wide_deep.movielens.etl writes parquet")
        files += [os.path.join(spec.base_directory, name) for name in chunk["files"]]
    if not files:
        raise ValueError(f"{spec.origin}: mapping {mapping!r} lists no files")
    return files


def load_part(spec: FeatureSpec, path: str) -> Dict[str, np.ndarray]:
    """One parquet part as the model's inputs: ids int32, a multi-hot as ``[N, max_hotness]`` int32 padded with -1
    (built from the list column's lengths and values: no Python object per row), the label float32."""
    names = model_feature_names(spec)
    table = pq.read_table(path, columns=names + [LABEL])
    rows = table.num_rows
    data = {}
    for name in names:
        column = table.column(name).combine_chunks()
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            data[name] = column.to_numpy().astype(np.int32)
            continue
        width = spec.max_hotness(name)
        lengths = pc.list_value_length(column).fill_null(0).to_numpy().astype(np.int64)
        if lengths.size and lengths.max() > width:
            row = int(np.argmax(lengths > width))
            raise ValueError(f"{path}: row {row}: {name} holds {int(lengths[row])} values, more than the spec's "
                             f"max_hotness {width}")
        values = column.flatten().to_numpy().astype(np.int32)
        padded = np.full((rows, width), -1, dtype=np.int32)
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        padded[np.repeat(np.arange(rows), lengths), np.arange(len(values)) - starts] = values
        data[name] = padded
    data[LABEL] = table.column(LABEL).to_numpy().astype(np.float32)
    return data


def load_split(spec: FeatureSpec, mapping: str) -> Dict[str, np.ndarray]:
    """One split in memory as the model's inputs (every part): ids int32 (genres ``[N, max_hotness]``, -1 padded),
    label float32. Training and evaluation stream the parts instead (:func:`training_batches`,
    ``wide_deep.movielens.train.evaluate_auc_parts``)."""
    parts = [load_part(spec, path) for path in part_files(spec, mapping)]
    data = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if len(data[LABEL]) == 0:
        raise ValueError(f"{spec.origin}: mapping {mapping!r} has no rows")
    return data


def split_rows(spec: FeatureSpec, mapping: str) -> int:
    """The rows of one split (the parts' parquet metadata)."""
    return sum(pq.ParquetFile(path).metadata.num_rows for path in part_files(spec, mapping))


def training_batches(spec: FeatureSpec, batch_size: int, seed: int):
    """Endless shuffled training batches, a part at a time (HugeCTR's non-epoch mode): every pass visits the parts in
    a new random order and each part's rows in a new random order; rows left over at the end of a part open the next
    batch. Memory: about two parts, whatever the number of ratings. A split of one part is read once."""
    files = part_files(spec, "train")
    rng = np.random.default_rng(seed)
    cached = load_part(spec, files[0]) if len(files) == 1 else None
    carry: Optional[Dict[str, np.ndarray]] = None
    while True:
        for index in rng.permutation(len(files)):
            part = cached if cached is not None else load_part(spec, files[index])
            order = rng.permutation(len(part[LABEL]))
            part = {k: v[order] for k, v in part.items()}
            if carry is not None:
                part = {k: np.concatenate([carry[k], v]) for k, v in part.items()}
            full = len(part[LABEL]) // batch_size * batch_size
            for lo in range(0, full, batch_size):
                yield {k: v[lo:lo + batch_size] for k, v in part.items()}
            carry = {k: v[full:] for k, v in part.items()}


def model_feature_names(spec: FeatureSpec) -> List[str]:
    """The model's inputs: the one-hot features, then the multi-hot ones, in the spec's order."""
    return list(spec.channel_spec[ONEHOT_CHANNEL]) + list(spec.channel_spec.get(MULTIHOT_CHANNEL, []))
