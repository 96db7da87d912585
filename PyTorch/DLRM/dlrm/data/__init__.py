"""Data for DLRM: split-binary datasets described by a FeatureSpec (read through ``recsys_common.datasets``) and
synthetic batches for benchmarks."""
from .datasets import (DataError, DatasetInfo, SplitBinaryBatches, SyntheticBatches, dataset_info,
                       default_synthetic_info)

__all__ = ["DataError", "DatasetInfo", "SplitBinaryBatches", "SyntheticBatches", "dataset_info",
           "default_synthetic_info"]
