"""Batches of ``(numerical, categorical, label)`` tensors for DLRM.

* :class:`SplitBinaryBatches` reads one mapping (``train``/``test``) of a dataset described by a FeatureSpec, in
  NVIDIA's split-binary layout (reference B.2) or any format ``recsys_common.datasets`` reads (CSV, parquet), and
  shards batches over processes: global batch ``j`` is the local batches ``j*W .. j*W+W-1`` of size
  ``batch_size / W``, local batch ``i`` going to rank ``i % W``. Every rank gets the same number of batches
  (collective steps need that); evaluation pads the last ones instead of dropping rows. Batches are read (and on
  CUDA copied on a side stream) by a background thread ``prefetch`` batches ahead (:mod:`dlrm.data.prefetch`), in
  the same order, so training from files costs about what random batches cost.
* :class:`SyntheticBatches` makes random Criteo-shaped batches on the target device (``--synthetic_dataset``,
  NVIDIA's ``synthetic_gpu``), for speed measurements only: its labels are random, so AUC stays near 0.5.

Each batch is ``(numerical float32 [B, n_num], categorical int64 [B, H], label float32 [B], valid int64)``,
where ``valid`` counts the real rows (the rest are padding) and ``H = sum(hotness)``: ``n_cat`` for single-hot data;
a multi-hot feature (``max_hotness`` h > 1 in the spec) takes h consecutive columns, its ids then -1 padding.

Errors (:class:`DataError`) name the file and feature: NaN or infinite numericals, an empty mapping, a negative
categorical id, an id at or above its cardinality (unless ``hash_indices``: then the model maps it to
``id % table size``, as NVIDIA's ``--hash_indices`` does), truncated files or a FeatureSpec that does not match the
files.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Iterator, List, Optional, Tuple

import numpy as np
import torch

from recsys_common.cli import InputError
from recsys_common.datasets import DatasetError, open_reader
from recsys_common.feature_spec import FeatureSpec, FeatureSpecError, negative_downsampling_rate

from .prefetch import DeviceTransfer, Prefetcher

Batch = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]


class DataError(InputError):
    """Input data the recipe cannot use; the message names the file and feature."""


@dataclasses.dataclass
class DatasetInfo:
    """What the model needs to know about the data."""
    categorical_features: List[str]
    cardinalities: List[int]
    numerical_features: List[str]
    label_features: List[str]
    spec: Optional[FeatureSpec] = None
    hotness: Optional[List[int]] = None   # ids per row of each categorical; None: all 1

    def __post_init__(self):
        if self.hotness is None:
            self.hotness = [1] * len(self.categorical_features)

    @property
    def negative_downsampling_rate(self) -> float:
        """The probability a train negative was kept (the spec's ``metadata.negative_downsampling_rate``, written by
        ``recsys_common.prepare_clicks``); evaluation adds its log to the logits. 1.0 without a spec or the key."""
        return negative_downsampling_rate(self.spec) if self.spec is not None else 1.0

    @property
    def num_numerical_features(self) -> int:
        return len(self.numerical_features)

    @property
    def id_columns(self) -> int:
        """Columns of the categorical id matrix: ``sum(hotness)``."""
        return sum(self.hotness)


def default_synthetic_info(table_sizes: List[int], num_numerical_features: int) -> DatasetInfo:
    return DatasetInfo([f"cat_{i}.bin" for i in range(len(table_sizes))], [int(n) for n in table_sizes],
                       [f"num_{i}" for i in range(num_numerical_features)], ["label"])


def dataset_info(dataset_dir: str, feature_spec: str = "feature_spec.yaml") -> DatasetInfo:
    """Load ``<dataset_dir>/<feature_spec>`` and check it has what DLRM needs."""
    path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset_dir, feature_spec)
    if not os.path.isfile(path):
        raise DataError(f"{path}: FeatureSpec not found (--dataset {dataset_dir} --feature_spec {feature_spec}); "
                        f"create a dataset with dlrm.scripts.prepare_synthetic_dataset, dlrm.scripts.transcode or "
                        f"preproc/prepare_dataset.sh")
    spec = FeatureSpec.from_yaml(path)
    channels = spec.channel_spec
    for channel in ("categorical", "numerical", "label"):
        if channel not in channels:
            raise DataError(f"{path}: channel_spec has no {channel!r} channel (has {sorted(channels)}); DLRM reads "
                            f"channels categorical, numerical and label")
    if len(channels["label"]) != 1:
        raise DataError(f"{path}: channel 'label' must hold exactly one feature, has {channels['label']}")
    cards = [spec.cardinality(name) for name in channels["categorical"]]
    hotness = [spec.max_hotness(name) for name in channels["categorical"]]   # multi-hot: sum-pooled bags
    return DatasetInfo(list(channels["categorical"]), cards, list(channels["numerical"]), list(channels["label"]),
                       spec, hotness)


def _to_tensors(batch: dict) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Host tensors (numerical float32, categorical int64, label float32) of one batch of numpy columns."""
    numerical = torch.from_numpy(np.ascontiguousarray(batch["numerical"], dtype=np.float32))
    categorical = torch.from_numpy(np.ascontiguousarray(batch["categorical"], dtype=np.int64))
    label = torch.from_numpy(np.ascontiguousarray(batch["label"], dtype=np.float32).reshape(-1))
    return numerical, categorical, label


class SplitBinaryBatches:
    """Batches of one mapping of a FeatureSpec dataset, sharded over ``world_size`` ranks.

    Args:
        info: from :func:`dataset_info`.
        mapping: ``"train"`` or ``"test"``.
        batch_size: the *global* batch size; each rank reads ``batch_size // world_size`` rows per batch.
        training: training drops the last partial global batch (all ranks take equal steps); evaluation keeps
            every row, padding the last batches (``valid`` says how many rows are real).
        shuffle: shuffle the batch order with ``seed + epoch`` (``--shuffle_batch_order``).
        subset: use only the first ``subset`` fraction of the rows (``--dataset_subset``).
        hash_indices: let categorical ids at or above their cardinality through (the model takes them modulo the
            table size, ``--hash_indices``); without it such an id is an error that names the file, feature and row.
        prefetch: batches read ahead by a worker thread (``--prefetch_batches``; 0: read on the calling thread).
    """

    def __init__(self, info: DatasetInfo, mapping: str, batch_size: int, device: torch.device, rank: int = 0,
                 world_size: int = 1, training: bool = True, shuffle: bool = False, seed: int = 0,
                 subset: Optional[float] = None, hash_indices: bool = False, prefetch: int = 2):
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} is not divisible by the {world_size} processes")
        self.info, self.mapping, self.device = info, mapping, device
        self.rank, self.world_size, self.training = rank, world_size, training
        self.local_batch_size = batch_size // world_size
        self.hash_indices = hash_indices
        if prefetch < 0:
            raise ValueError(f"--prefetch_batches must be >= 0, got {prefetch}")
        self.prefetch = prefetch
        self._transfer = DeviceTransfer(device, side_stream=prefetch > 0)
        spec = info.spec
        if mapping not in spec.source_spec:
            raise DataError(f"{spec.origin}: source_spec has no {mapping!r} mapping (has {sorted(spec.source_spec)})")
        try:
            self.reader = open_reader(spec, mapping, self.local_batch_size, channels=["numerical", "categorical",
                                                                                       "label"],
                                      rank=rank, world_size=world_size, shuffle=shuffle, seed=seed,
                                      drop_last=training, check_values=False)  # _check_categorical below
        except (DatasetError, FeatureSpecError) as e:
            raise DataError(str(e)) from None
        self.num_samples = self.reader.num_samples
        if self.num_samples == 0:
            files = [spec.resolve_file(c["files"][0]) for c in spec.source_spec[mapping]]
            raise DataError(f"{spec.origin}: mapping {mapping!r} is empty (0 rows in {', '.join(files)})")
        if subset is not None:
            if not 0.0 < subset <= 1.0:
                raise ValueError(f"--dataset_subset must be in (0, 1], got {subset}")
            self.num_samples = max(1, int(self.num_samples * subset))
        full, rest = divmod(self.num_samples, self.local_batch_size)
        self.total_local_batches = full + (1 if rest and not training else 0)
        if training:
            self.steps = self.total_local_batches // world_size  # whole global batches only
            if self.steps == 0:
                raise DataError(f"{spec.origin}: mapping {mapping!r} has {self.num_samples} rows, fewer than one "
                                f"global batch of {batch_size}; lower --batch_size")
        else:
            self.steps = math.ceil(self.total_local_batches / world_size)
        self._numerical_file = self._file_of(info.numerical_features[0]) if info.numerical_features else None
        # per id column: its table's cardinality, its table, whether -1 padding is allowed (multi-hot)
        self._column_table = np.asarray([t for t, h in enumerate(info.hotness) for _ in range(h)], dtype=np.int64)
        self._cardinalities = np.asarray(info.cardinalities, dtype=np.int64)[self._column_table]
        self._column_padded = np.asarray([h > 1 for h in info.hotness for _ in range(h)], dtype=bool)

    def _file_of(self, feature: str) -> str:
        spec = self.info.spec
        for chunk in spec.source_spec[self.mapping]:
            if feature in chunk["features"]:
                return spec.resolve_file(chunk["files"][0])
        return spec.origin

    def set_epoch(self, epoch: int) -> None:
        self.reader.set_epoch(epoch)

    def __len__(self) -> int:
        return self.steps

    def _order(self) -> np.ndarray:
        order = np.arange(self.total_local_batches)
        if self.reader.shuffle:
            np.random.default_rng(self.reader.seed + self.reader.epoch).shuffle(order)
        return order

    def iterate(self, start_step: int = 0) -> Iterator[Batch]:
        """Yield this rank's batches from global step ``start_step`` (resuming skips without reading).

        With ``prefetch > 0`` the batches are read (and on CUDA copied) by a worker thread that stays ``prefetch``
        batches ahead (:mod:`dlrm.data.prefetch`); the order is the same, errors are raised here at the batch that
        failed, and closing this generator (a ``break``, an exception) stops the thread.
        """
        order = self._order()  # fixed now, on this thread: a later set_epoch does not change this pass
        host = self._host_batches(order, start_step)
        if self.prefetch <= 0:
            for batch in host:
                yield self._batch(self._transfer.finish(self._transfer.stage(batch)))
            return
        with Prefetcher(host, self.prefetch, stage=self._transfer.stage, device=self.device,
                        name=f"dlrm-prefetch-{self.mapping}-rank{self.rank}") as batches:
            for staged in batches:
                yield self._batch(self._transfer.finish(staged))

    @staticmethod
    def _batch(moved) -> Batch:
        (numerical, categorical, label), valid = moved
        return numerical, categorical, label, valid

    def _host_batches(self, order: np.ndarray, start_step: int) -> Iterator[Tuple[Tuple[torch.Tensor, ...], int]]:
        """``((numerical, categorical, label) host tensors, valid rows)`` per step from ``start_step``: read,
        checked and padded (runs on the prefetch thread)."""
        for step in range(start_step, self.steps):
            position = step * self.world_size + self.rank
            if position >= len(order):  # evaluation: this rank has no batch left; pad with an empty one
                yield self._padding_batch_host(), 0
                continue
            index = int(order[position])
            raw, start, stop = self._read(index)
            self._check_numerical(raw["numerical"], start)
            self._check_categorical(raw["categorical"], start)
            numerical, categorical, label = _to_tensors(raw)
            valid = stop - start
            if not self.training and self.world_size > 1 and valid < self.local_batch_size:
                numerical, categorical, label = _pad(numerical, categorical, label, self.local_batch_size)
            yield (numerical, categorical, label), valid

    def _read(self, index: int):
        """Local batch ``index`` as numpy columns, and its row range; any read failure is a DataError naming the
        mapping's files."""
        start = index * self.local_batch_size
        stop = min(start + self.local_batch_size, self.num_samples)
        try:
            raw = self.reader.read_batch(index)
        except (DatasetError, FeatureSpecError) as e:
            raise DataError(str(e)) from None
        except (OSError, ValueError) as e:  # e.g. a file truncated or removed under a running job
            files = sorted({f for s in self.reader.sources for f in s.files})
            raise DataError(f"{self.info.spec.origin}: mapping {self.mapping!r}: cannot read rows {start}..{stop - 1} "
                            f"(local batch {index}) from {', '.join(files)}: {type(e).__name__}: {e}") from e
        rows = stop - start
        categorical = raw["categorical"]
        if isinstance(categorical, list):   # multi-hot: one [B, h] array per feature (-1 padded) -> [B, sum(h)]
            categorical = np.concatenate([np.asarray(c, np.int64).reshape(len(c), -1) for c in categorical], axis=1)
        raw = {k: v[:rows] for k, v in raw.items() if k != "categorical"}
        raw["categorical"] = np.asarray(categorical)[:rows].reshape(rows, -1)   # (rows, 0) without categoricals
        return raw, start, stop

    def __iter__(self) -> Iterator[Batch]:
        return self.iterate(0)

    def _padding_batch_host(self) -> Tuple[torch.Tensor, ...]:
        n = self.local_batch_size
        return (torch.zeros(n, len(self.info.numerical_features)),
                torch.zeros(n, self.info.id_columns, dtype=torch.int64), torch.zeros(n))

    def _check_categorical(self, values: np.ndarray, first_row: int) -> None:
        """Ids must be >= 0, and < cardinality unless ``hash_indices`` (then the model takes ``id % rows``)."""
        values = np.asarray(values).reshape(len(values), -1)
        if values.size == 0:
            return
        bad = values < 0
        if self._column_padded.any():
            bad &= ~((values == -1) & self._column_padded[None, :])   # padding of a multi-hot bag
        if not self.hash_indices:
            bad |= values >= self._cardinalities[None, :]
        if not bad.any():
            return
        row, column = np.argwhere(bad)[0]
        name, value = self.info.categorical_features[self._column_table[column]], int(values[row, column])
        card = int(self._cardinalities[column])
        where = f"{self._file_of(name)}: feature {name!r} row {first_row + int(row)} has id {value}"
        if value < 0:
            raise DataError(f"{where}; ids must be >= 0")
        raise DataError(f"{where}, outside [0, cardinality={card}); fix the FeatureSpec's cardinality, or pass "
                        f"--hash_indices to map ids with id % table size")

    def _check_numerical(self, values: np.ndarray, first_row: int) -> None:
        if values.size and not np.isfinite(values).all():
            row, column = np.argwhere(~np.isfinite(values))[0]
            name = self.info.numerical_features[column]
            raise DataError(f"{self._numerical_file}: numerical feature {name!r} row {first_row + int(row)} is "
                            f"{values[row, column]} (NaN/inf); preprocessing must map missing values to numbers")


def _pad(numerical, categorical, label, size):
    extra = size - numerical.shape[0]
    return (torch.cat([numerical, numerical.new_zeros(extra, numerical.shape[1])]),
            torch.cat([categorical, categorical.new_zeros(extra, categorical.shape[1])]),
            torch.cat([label, label.new_zeros(extra)]))


class SyntheticBatches:
    """Random batches made on ``device`` (ids uniform in each table, numericals uniform in [0, 1), random labels).

    A pool of ``pool_size`` distinct batches is generated once and cycled, so generation never dominates timings.
    """

    def __init__(self, info: DatasetInfo, num_entries: int, batch_size: int, device: torch.device, rank: int = 0,
                 world_size: int = 1, seed: int = 12345, pool_size: int = 8, training: bool = True):
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} is not divisible by the {world_size} processes")
        self.info, self.device = info, device
        self.local_batch_size = batch_size // world_size
        self.steps = max(1, num_entries // batch_size)
        self.num_samples = self.steps * batch_size
        generator = torch.Generator().manual_seed(seed * 1000 + rank)
        self.pool = []
        for _ in range(min(pool_size, self.steps)):
            n = self.local_batch_size
            numerical = torch.rand(n, info.num_numerical_features, generator=generator)
            categorical = torch.stack([torch.randint(0, c, (n,), generator=generator) for c in info.cardinalities],
                                      dim=1) if info.cardinalities else torch.zeros(n, 0, dtype=torch.int64)
            label = torch.randint(0, 2, (n,), generator=generator).float()
            self.pool.append((numerical.to(device), categorical.to(device), label.to(device), n))

    def set_epoch(self, epoch: int) -> None:
        pass

    def __len__(self) -> int:
        return self.steps

    def iterate(self, start_step: int = 0) -> Iterator[Batch]:
        for step in range(start_step, self.steps):
            yield self.pool[step % len(self.pool)]

    def __iter__(self) -> Iterator[Batch]:
        return self.iterate(0)
