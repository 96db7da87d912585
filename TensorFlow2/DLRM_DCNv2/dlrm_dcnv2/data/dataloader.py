"""``create_input``: the one entry point from flags to batches (the shared base is :mod:`.pipeline`); and
:class:`DataConfig`, a run's data settled once: the flags and the feature spec, parsed once and handed down to
every split the run opens.

Every pipeline yields the batch layout described in :mod:`.pipeline` (numerical, categorical, labels).

    >>> from dlrm_dcnv2.data import create_input
    >>> data = create_input("synthetic", None, global_batch_size=64, synthetic_train_batches=3,
    ...                     synthetic_cardinalities=[10, 20], synthetic_hotness=[1, 3],
    ...                     synthetic_num_numerical=2)
    >>> num, cat, lab = next(iter(data)); len(data), num.shape, [c.shape for c in cat], lab.shape
    (3, TensorShape([64, 2]), [TensorShape([64]), TensorShape([64, 3])], TensorShape([64]))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from recsys_common.datasets import count_rows
from recsys_common.feature_spec import FeatureSpec

# The shared base is re-exported: callers (train.py, serving.py, deployment/, tests) import these names from here.
from .pipeline import (PAD, BatchPipeline, DataError, DatasetMetadata, batch_layout, label_feature,  # noqa: F401
                       load_spec, metadata_from_spec)
from .raw_binary_dataset import RawBinaryDataset
from .split_tfrecords_dataset import SplitTFRecordsDataset
from .synthetic_dataset import SyntheticDataset

DATASET_TYPES = ("tf_raw", "synthetic", "split_tfrecords")
# The synthetic dataset's hidden model when --seed is not given: fixed, so train and test always share it.
SYNTHETIC_SEED = 12345


def create_input(dataset_type: str, dataset_path: Optional[str], feature_spec: str = "feature_spec.yaml",
                 mapping: str = "train", global_batch_size: int = 65536, rank: int = 0, world_size: int = 1,
                 input_tables: Optional[Sequence[Tuple[int, bool]]] = None,
                 synthetic_train_batches: int = 64008, synthetic_valid_batches: int = 1350,
                 synthetic_cardinalities: Optional[Sequence[int]] = None,
                 synthetic_hotness: Optional[Sequence[int]] = None, synthetic_num_numerical: int = 13,
                 synthetic_use_feature_spec: bool = False, synthetic_cached_batches: int = 0, seed: int = 12345,
                 prefetch: int = 2, check_values: bool = True, allow_nonfinite: bool = False,
                 ctx=None, placement=None, spec: Optional[FeatureSpec] = None) -> BatchPipeline:
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
        spec: the parsed feature spec (a run parses it once: :class:`DataConfig`); ``None`` reads
            ``dataset_path/feature_spec`` where the dataset type needs one.
    """
    if ctx is not None:
        rank, world_size = ctx.rank, ctx.world_size
    if placement is not None and input_tables is None:
        input_tables = placement.input_tables(rank)
    common = dict(global_batch_size=global_batch_size, rank=rank, world_size=world_size, input_tables=input_tables,
                  prefetch=prefetch, check_values=check_values, allow_nonfinite=allow_nonfinite)
    if dataset_type == "synthetic":
        if synthetic_use_feature_spec and spec is None:
            spec = load_spec(dataset_path, feature_spec, "--synthetic_dataset_use_feature_spec")
        return SyntheticDataset(num_batches=synthetic_train_batches if mapping == "train" else
                                synthetic_valid_batches,
                                cardinalities=synthetic_cardinalities, hotness=synthetic_hotness,
                                num_numerical=synthetic_num_numerical,
                                spec=spec if synthetic_use_feature_spec else None, seed=seed,
                                stream=0 if mapping == "train" else 1, cached_batches=synthetic_cached_batches,
                                **common)
    if dataset_type not in DATASET_TYPES:
        raise ValueError(f"--dataset_type {dataset_type!r} is not one of {', '.join(DATASET_TYPES)}")
    spec = spec if spec is not None else load_spec(dataset_path, feature_spec)
    if dataset_type == "tf_raw":
        return RawBinaryDataset(spec, mapping, **common)
    return SplitTFRecordsDataset(spec, mapping, **common)


@dataclass(frozen=True)
class DataConfig:
    """Where a run's rows come from, read once from the flags (:meth:`from_flags`), with the feature spec parsed
    once (``spec``: None for the synthetic data without ``--synthetic_dataset_use_feature_spec``); every split the
    run opens (:meth:`open`) and every figure taken from the data (:meth:`shape`, :meth:`train_rows`) uses it."""
    dataset_type: str = "tf_raw"
    dataset_path: Optional[str] = None
    feature_spec: str = "feature_spec.yaml"
    synthetic_train_batches: int = 64008
    synthetic_valid_batches: int = 1350
    synthetic_cardinalities: Sequence[int] = (1000,) * 26
    synthetic_hotness: Sequence[int] = (20,) * 26
    synthetic_num_numerical: int = 13
    synthetic_use_feature_spec: bool = False
    seed: int = SYNTHETIC_SEED
    spec: Optional[FeatureSpec] = field(default=None, compare=False, repr=False)

    @classmethod
    def from_flags(cls, args) -> "DataConfig":
        """The flags of ``dlrm.py`` (``args``: any object with their names); reads the feature spec (the one
        parse of it in a run) where the dataset type needs it."""
        spec = None
        if args.dataset_type != "synthetic" or args.synthetic_dataset_use_feature_spec:
            spec = load_spec(args.dataset_path, args.feature_spec, "--feature_spec")
        return cls(args.dataset_type, args.dataset_path, args.feature_spec, args.synthetic_dataset_train_batches,
                   args.synthetic_dataset_valid_batches, tuple(args.synthetic_dataset_cardinalities),
                   tuple(args.synthetic_dataset_hotness), args.synthetic_dataset_num_numerical_features,
                   args.synthetic_dataset_use_feature_spec, SYNTHETIC_SEED if args.seed is None else args.seed,
                   spec)

    def shape(self) -> Tuple[List[int], List[int], int]:
        """``(table_sizes, hotness, num_numerical_features)`` of the data (the spec, or the synthetic flags)."""
        if self.spec is None:
            sizes = list(self.synthetic_cardinalities)
            hotness = list(self.synthetic_hotness)
            return sizes, hotness * len(sizes) if len(hotness) == 1 else hotness, int(self.synthetic_num_numerical)
        meta = metadata_from_spec(self.spec)
        return list(meta.table_sizes), list(meta.hotness), int(meta.num_numerical)

    @property
    def negative_downsampling_rate(self) -> float:
        """The probability a train negative was kept (the spec's ``metadata.negative_downsampling_rate``, written by
        ``recsys_common.prepare_clicks``); 1.0 for the synthetic data without a spec."""
        return 1.0 if self.spec is None else metadata_from_spec(self.spec).negative_downsampling_rate

    def train_rows(self) -> Optional[int]:
        """Rows of the training split, read from the files' sizes; None where only reading would tell (TFRecords),
        and for the synthetic type (its rows are batches x batch size)."""
        if self.dataset_type != "tf_raw" or self.spec is None:
            return None
        return count_rows(self.spec, "train")

    def open(self, mapping: str, global_batch_size: int, ctx=None, placement=None) -> BatchPipeline:
        """This rank's batches of ``mapping`` ("train" / "test"): an iterable with ``len()`` (and ``iterate(start)``)."""
        return create_input(self.dataset_type, self.dataset_path, self.feature_spec, mapping=mapping,
                            global_batch_size=global_batch_size, ctx=ctx, placement=placement,
                            synthetic_train_batches=self.synthetic_train_batches,
                            synthetic_valid_batches=self.synthetic_valid_batches,
                            synthetic_cardinalities=list(self.synthetic_cardinalities),
                            synthetic_hotness=list(self.synthetic_hotness),
                            synthetic_num_numerical=self.synthetic_num_numerical,
                            synthetic_use_feature_spec=self.synthetic_use_feature_spec, seed=self.seed,
                            spec=self.spec)

