"""``create_input``: the one entry point from flags to batches (the shared base is :mod:`.pipeline`).

Every pipeline yields the batch layout described in :mod:`.pipeline` (numerical, categorical, labels).

    >>> from dlrm_dcnv2.dataloading import create_input
    >>> data = create_input("synthetic", None, global_batch_size=64, synthetic_train_batches=3,
    ...                     synthetic_cardinalities=[10, 20], synthetic_hotness=[1, 3],
    ...                     synthetic_num_numerical=2)
    >>> num, cat, lab = next(iter(data)); len(data), num.shape, [c.shape for c in cat], lab.shape
    (3, TensorShape([64, 2]), [TensorShape([64]), TensorShape([64, 3])], TensorShape([64]))
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

# The shared base is re-exported: callers (main.py, deployment/, tests) import these names from here.
from .pipeline import (PAD, BatchPipeline, DataError, DatasetMetadata, batch_layout, label_feature,  # noqa: F401
                       load_spec, metadata_from_spec)
from .raw_binary_dataset import RawBinaryDataset
from .split_tfrecords_dataset import SplitTFRecordsDataset
from .synthetic_dataset import SyntheticDataset

DATASET_TYPES = ("tf_raw", "synthetic", "split_tfrecords")


def create_input(dataset_type: str, dataset_path: Optional[str], feature_spec: str = "feature_spec.yaml",
                 mapping: str = "train", global_batch_size: int = 65536, rank: int = 0, world_size: int = 1,
                 input_tables: Optional[Sequence[Tuple[int, bool]]] = None,
                 synthetic_train_batches: int = 64008, synthetic_valid_batches: int = 1350,
                 synthetic_cardinalities: Optional[Sequence[int]] = None,
                 synthetic_hotness: Optional[Sequence[int]] = None, synthetic_num_numerical: int = 13,
                 synthetic_use_feature_spec: bool = False, synthetic_cached_batches: int = 0, seed: int = 12345,
                 prefetch: int = 2, check_values: bool = True, allow_nonfinite: bool = False,
                 ctx=None, placement=None) -> BatchPipeline:
    """Open one split (``mapping``: ``train`` or ``test``) for this rank; returns a :class:`BatchPipeline`.

    Args:
        dataset_type: ``tf_raw`` (split-binary per reference B.2; specs with csv/parquet chunks are read in memory),
            ``synthetic`` (generated per batch, flags ``--synthetic_dataset_*``) or ``split_tfrecords`` (prebatched,
            multi-hot capable; written by ``python -m dlrm_dcnv2.dataloading.transcribe``).
        dataset_path, feature_spec: the dataset directory and the spec's file name relative to it.
        global_batch_size: rows per step over all ranks; each rank's data-parallel slice is ``B / world_size``.
        rank, world_size, input_tables: this rank; ``input_tables`` = ``Placement.input_tables(rank)``
            (default: every table, whole batch, for a single rank). ``ctx``/``placement`` fill them when given.
        synthetic_*: NVIDIA's synthetic flags; with ``synthetic_use_feature_spec`` the tables, hotness and
            numericals come from the spec in ``dataset_path``. ``synthetic_cached_batches > 0`` repeats that many
            distinct batches (for throughput benchmarks where generating would dominate). ``mapping`` ``train``
            yields ``synthetic_train_batches`` batches, any other ``synthetic_valid_batches``.
        seed: the synthetic data's seed (same seed, same data on any world size).
        check_values, allow_nonfinite: per-batch id range and NaN/inf checks (on by default; NaN is an error).
    """
    if ctx is not None:
        rank, world_size = ctx.rank, ctx.world_size
    if placement is not None and input_tables is None:
        input_tables = placement.input_tables(rank)
    common = dict(global_batch_size=global_batch_size, rank=rank, world_size=world_size, input_tables=input_tables,
                  prefetch=prefetch, check_values=check_values, allow_nonfinite=allow_nonfinite)
    if dataset_type == "synthetic":
        spec = None
        if synthetic_use_feature_spec:
            spec = load_spec(dataset_path, feature_spec, "--synthetic_dataset_use_feature_spec")
        return SyntheticDataset(num_batches=synthetic_train_batches if mapping == "train" else
                                synthetic_valid_batches,
                                cardinalities=synthetic_cardinalities, hotness=synthetic_hotness,
                                num_numerical=synthetic_num_numerical, spec=spec, seed=seed,
                                stream=0 if mapping == "train" else 1, cached_batches=synthetic_cached_batches,
                                **common)
    if dataset_type == "tf_raw":
        return RawBinaryDataset(load_spec(dataset_path, feature_spec), mapping, **common)
    if dataset_type == "split_tfrecords":
        return SplitTFRecordsDataset(load_spec(dataset_path, feature_spec), mapping, **common)
    raise ValueError(f"--dataset_type {dataset_type!r} is not one of {', '.join(DATASET_TYPES)}")
