"""The batch pipeline every dataset type shares: :class:`BatchPipeline`, :class:`DataError`, the spec helpers.

The three dataset modules (``raw_binary_dataset``, ``split_tfrecords_dataset``, ``synthetic_dataset``) build on
this module and :mod:`.dataloader` (``create_input``) chooses between them: the base lives here, on its own, so
the dataset modules and the entry point import downward only (no cycle).

A pipeline yields, per step, the batch tuple of the design (all tf tensors)::

    numerical    float32 [b, num_numerical]    rows [rank*b, (rank+1)*b) of the global batch (b = B / world_size)
    categorical  tuple, one int32 tensor per entry of ``input_tables`` (the order of Placement.input_tables(rank)):
                 a model-parallel table (is_global_batch True) gets the whole global batch [B] (one-hot) or
                 [B, hotness] (multi-hot, padded with -1); a data-parallel table gets the local slice [b] / [b, h]
    labels       float32 [b]

Batches come in file order (the preprocessing shuffled the rows already, as NVIDIA's). ``len(pipeline)`` is the
number of batches of an epoch; ``pipeline.skip(n)`` makes the next iteration start at batch ``n`` (exact resume
after a checkpoint), after which iterations start at 0 again.

The last partial batch: its rows are cut to a multiple of ``world_size`` (at most ``world_size - 1`` rows dropped,
logged) so every rank gets the same number of rows; a batch left with no rows is dropped.

Data checks run on every batch and cost a min/max (or isfinite) over arrays already in memory: categorical ids
outside ``[0, cardinality)`` and non-finite numericals raise :class:`DataError` naming the file, feature and row.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from recsys_common.datasets import DatasetError
from recsys_common.feature_spec import FeatureSpec, is_categorical_channel, negative_downsampling_rate
from recsys_common.prefetch import prefetched

LOG = logging.getLogger("dlrm_dcnv2.data")

PAD = -1


class DataError(DatasetError):
    """Input data that cannot be trained on; the message names the file, feature and row (a ``ValueError``)."""


@dataclass
class DatasetMetadata:
    """What the model needs to know about the data: one entry per table (= categorical feature, channel order)."""
    table_sizes: List[int]
    hotness: List[int]
    num_numerical: int
    categorical_features: List[str]
    numerical_features: List[str]
    # The probability a train negative was kept (feature_spec metadata, recsys_common.prepare_clicks
    # --negative_downsampling_rate); evaluation adds log of it to the logits. 1.0: nothing dropped.
    negative_downsampling_rate: float = 1.0

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)


def batch_layout(num_rows: int, global_batch_size: int, world_size: int) -> List[Tuple[int, int]]:
    """``(first_row, rows)`` of every batch: full batches, then the tail cut to a multiple of ``world_size``."""
    full, tail = divmod(num_rows, global_batch_size)
    layout = [(i * global_batch_size, global_batch_size) for i in range(full)]
    kept = tail - tail % world_size
    if kept:
        layout.append((full * global_batch_size, kept))
    return layout


class BatchPipeline:
    """Base of every dataset type: batch order, resume, local slicing, checks, prefetch and tf conversion.

    Subclasses set ``metadata``, ``num_rows`` (rows of the split) and implement :meth:`_read_numerical`,
    :meth:`_read_labels`, :meth:`_read_categorical` (rows ``[start, stop)`` of the split, numpy) and
    :meth:`_source_of` (the file a feature comes from, for error messages); or override :meth:`_numpy_batch`.
    """

    def __init__(self, global_batch_size: int, rank: int = 0, world_size: int = 1,
                 input_tables: Optional[Sequence[Tuple[int, bool]]] = None, prefetch: int = 2,
                 check_values: bool = True, allow_nonfinite: bool = False, name: str = "dataset"):
        if global_batch_size < 1:
            raise ValueError(f"--batch_size must be >= 1, got {global_batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if global_batch_size % world_size:
            raise ValueError(f"global batch size {global_batch_size} (--batch_size / --valid_batch_size) is not a "
                             f"multiple of the number of ranks {world_size}")
        self.global_batch_size = global_batch_size
        self.rank, self.world_size = rank, world_size
        self.prefetch = max(0, int(prefetch))
        self.check_values = check_values
        self.allow_nonfinite = allow_nonfinite
        self.name = name
        self._input_tables_arg = input_tables
        self.start_batch = 0
        self._layout: Optional[List[Tuple[int, int]]] = None

    # ------------------------------------------------------------------------------------------------ set-up
    def _finish_init(self) -> None:
        """Called by subclasses once ``metadata`` and ``num_rows`` are known."""
        n_tables = self.metadata.num_tables
        if self._input_tables_arg is None:
            if self.world_size > 1:
                raise ValueError("input_tables is required with world_size > 1 (Placement.input_tables(rank))")
            self.input_tables = [(t, True) for t in range(n_tables)]
        else:
            self.input_tables = [(int(t), bool(g)) for t, g in self._input_tables_arg]
            for t, _ in self.input_tables:
                if not 0 <= t < n_tables:
                    raise ValueError(f"input table {t} outside the dataset's {n_tables} categorical features")
        self._group_tables()
        if self.num_rows == 0:
            raise DataError(f"{self.name}: the split is empty (0 rows); nothing to train or evaluate on")
        self._layout = batch_layout(self.num_rows, self.global_batch_size, self.world_size)
        if not self._layout:
            raise DataError(f"{self.name}: {self.num_rows} row(s) are fewer than the {self.world_size} ranks; "
                            f"no batch can be formed")
        dropped = self.num_rows - sum(n for _, n in self._layout)
        if dropped:
            LOG.warning("%s: the last partial batch drops %d of its %d row(s) so that the rest split evenly over %d "
                        "ranks", self.name, dropped, self.num_rows % self.global_batch_size, self.world_size)

    # ------------------------------------------------------------------------------------------------ protocol
    def __len__(self) -> int:
        return len(self._layout)

    @property
    def num_samples(self) -> int:
        """Rows that an epoch trains on (global, after the tail cut)."""
        return sum(n for _, n in self._layout)

    def skip(self, n: int) -> "BatchPipeline":
        """Make the next iteration start ``n`` batches later (cumulative until an iteration starts)."""
        if n < 0:
            raise ValueError(f"skip({n}): n must be >= 0")
        self.start_batch += int(n)
        return self

    def __iter__(self) -> Iterator[tuple]:
        start, self.start_batch = self.start_batch, 0
        return self.iterate(start)

    def iterate(self, start: int = 0) -> Iterator[tuple]:
        """Batches ``start, start+1, ...`` of the epoch as tf tensors (background prefetch of ``prefetch``)."""
        indices = range(min(start, len(self)), len(self))
        if self.prefetch == 0:
            for i in indices:
                yield self._to_tensors(self._numpy_batch(i))
            return
        yield from prefetched((self._to_tensors(self._numpy_batch(i)) for i in indices), self.prefetch,
                              name="dlrm-input-prefetch")

    def numpy_batch(self, index: int) -> tuple:
        """Batch ``index`` as numpy arrays (same layout as the tensors), checked."""
        numerical, groups, labels = self._numpy_batch(index)
        categorical = [None] * len(self.input_tables)
        for positions, array, stacked in groups:
            for j, pos in enumerate(positions):
                categorical[pos] = array[j] if stacked else array
        return numerical, tuple(categorical), labels

    # ------------------------------------------------------------------------------------------------ batch
    def _numpy_batch(self, index: int) -> tuple:
        """``(numerical, groups, labels)``; ``groups``: ``(positions in input_tables, array, stacked)``.

        One-hot tables read for the same rows are stacked table-major into one int32 ``[k, rows]`` array: one
        vectorised range check and one tensor conversion (then ``tf.unstack``) instead of ``k`` of each, which
        is most of the per-batch cost at small batches.
        """
        first, rows = self._layout[index]
        b = rows // self.world_size
        lo, hi = first + self.rank * b, first + (self.rank + 1) * b
        numerical = self._checked_numerical(self._read_numerical(lo, hi), lo)
        labels = np.asarray(self._read_labels(lo, hi), dtype=np.float32).reshape(-1)
        groups = []
        for is_global, positions in self._one_hot_groups:
            start, stop = (first, first + rows) if is_global else (lo, hi)
            stacked = np.empty((len(positions), stop - start), dtype=np.int32)
            for j, pos in enumerate(positions):
                ids = self._read_categorical(self.input_tables[pos][0], start, stop)
                if ids.dtype.itemsize > 4:   # int64 (csv/parquet) would wrap silently into int32: check first
                    self._checked_ids(self.input_tables[pos][0], ids, start)
                stacked[j] = ids
            self._check_stacked(positions, stacked, start)
            groups.append((positions, stacked, True))
        for pos in self._multi_hot_positions:
            table, is_global = self.input_tables[pos]
            start, stop = (first, first + rows) if is_global else (lo, hi)
            ids = self._read_categorical(table, start, stop)
            groups.append(([pos], self._checked_ids(table, ids, start), False))
        return numerical, groups, labels

    def _group_tables(self) -> None:
        """One-hot input tables grouped by row range (global batch first), and the multi-hot ones."""
        hot = self.metadata.hotness
        groups = {}
        for pos, (table, is_global) in enumerate(self.input_tables):
            if hot[table] == 1:
                groups.setdefault(is_global, []).append(pos)
        self._one_hot_groups = sorted(groups.items(), key=lambda kv: not kv[0])
        self._multi_hot_positions = [p for p, (t, _) in enumerate(self.input_tables) if hot[t] > 1]

    def _check_stacked(self, positions, stacked: np.ndarray, first_row: int) -> None:
        if not self.check_values or not stacked.size:
            return
        cards = np.array([self.metadata.table_sizes[self.input_tables[p][0]] for p in positions])
        bad = (stacked.min(axis=1) < 0) | (stacked.max(axis=1) >= cards)
        if bad.any():
            j = int(np.argmax(bad))
            self._checked_ids(self.input_tables[positions[j]][0], stacked[j], first_row)

    def _checked_numerical(self, values: np.ndarray, first_row: int) -> np.ndarray:
        values = np.asarray(values)
        if values.ndim == 1:
            values = values.reshape(-1, 1)
        if self.check_values and not self.allow_nonfinite and values.size and \
                not (np.isfinite(values.min()) and np.isfinite(values.max())):  # NaN propagates into min/max
            row, col = (int(x[0]) for x in np.nonzero(~np.isfinite(values)))
            feature = self.metadata.numerical_features[col]
            raise DataError(f"{self._source_of(feature)}: numerical feature {feature!r} row {first_row + row} is "
                            f"{values[row, col]} (NaN/inf); fix the preprocessing")
        return values.astype(np.float32, copy=False)

    def _checked_ids(self, table: int, ids: np.ndarray, first_row: int) -> np.ndarray:
        ids = np.asarray(ids)
        if self.check_values and ids.size:
            card = self.metadata.table_sizes[table]
            lo, hi = int(ids.min()), int(ids.max())
            padded = ids.ndim == 2
            if lo < (PAD if padded else 0) or hi >= card:
                bad = ((ids < 0) & (ids != PAD)) | (ids >= card) if padded else (ids < 0) | (ids >= card)
                where = np.nonzero(bad)
                row = int(where[0][0])
                value = ids[tuple(w[0] for w in where)]
                feature = self.metadata.categorical_features[table]
                raise DataError(f"{self._source_of(feature)}: categorical feature {feature!r} row {first_row + row} "
                                f"has id {value} outside [0, cardinality={card})")
        return ids.astype(np.int32, copy=False)

    def _to_tensors(self, batch: tuple) -> tuple:
        import tensorflow as tf
        numerical, groups, labels = batch
        categorical = [None] * len(self.input_tables)
        for positions, array, stacked in groups:
            tensors = tf.unstack(tf.convert_to_tensor(array)) if stacked else [tf.convert_to_tensor(array)]
            for pos, tensor in zip(positions, tensors):
                categorical[pos] = tensor
        return tf.convert_to_tensor(numerical), tuple(categorical), tf.convert_to_tensor(labels)

    # ------------------------------------------------------------------------------------------------ abstract
    def _read_numerical(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def _read_labels(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def _read_categorical(self, table: int, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def _source_of(self, feature: str) -> str:
        return self.name



class SpecPipeline(BatchPipeline):
    """A pipeline over one split (``mapping``) of a dataset described by a FeatureSpec: checks the split exists and
    the spec is valid for it, and sets ``spec``, ``mapping``, ``metadata`` and ``label`` (the base of the
    split-binary and split_tfrecords datasets)."""

    def __init__(self, spec, mapping: str, **kwargs):
        if mapping not in spec.source_spec:
            raise DataError(f"{spec.origin}: source_spec has no split {mapping!r} (has: "
                            f"{', '.join(spec.source_spec)})")
        super().__init__(name=os.path.join(spec.base_directory, mapping), **kwargs)
        spec.validate(mappings=[mapping])
        self.spec, self.mapping = spec, mapping
        self.metadata = metadata_from_spec(spec)
        self.label = label_feature(spec)

def load_spec(dataset_path: Optional[str], feature_spec: str, needed_by: str = "--dataset_type"):
    """The FeatureSpec at ``dataset_path/feature_spec`` (an absolute ``feature_spec`` is used as is)."""
    if not dataset_path and not os.path.isabs(feature_spec or ""):
        raise ValueError(f"{needed_by} needs --dataset_path (the directory holding {feature_spec})")
    path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset_path, feature_spec)
    if not os.path.isfile(path):
        raise DataError(f"{path}: feature spec not found (--dataset_path {dataset_path}, --feature_spec "
                        f"{feature_spec})")
    return FeatureSpec.from_yaml(path)


def metadata_from_spec(spec) -> DatasetMetadata:
    """Tables, hotness and numericals of a spec's ``categorical`` / ``numerical`` channels (in channel order)."""
    cats = [f for ch, names in spec.channel_spec.items() if is_categorical_channel(ch) for f in names]
    nums = [f for ch, names in spec.channel_spec.items()
            if not is_categorical_channel(ch) and "label" not in ch.lower() for f in names]
    return DatasetMetadata(table_sizes=[spec.cardinality(f) for f in cats],
                           hotness=[spec.max_hotness(f) for f in cats], num_numerical=len(nums),
                           categorical_features=cats, numerical_features=nums,
                           negative_downsampling_rate=negative_downsampling_rate(spec))


def label_feature(spec) -> str:
    labels = [f for ch, names in spec.channel_spec.items() if "label" in ch.lower() for f in names]
    if len(labels) != 1:
        raise DataError(f"{spec.origin}: expected exactly one label feature in the label channel, got {labels}")
    return labels[0]
