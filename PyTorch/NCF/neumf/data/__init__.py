"""NCF's data: the converted dataset read into memory (:mod:`.loading`), MovieLens conversion (:mod:`.convert`,
``python convert.py``) and a generated MovieLens-shaped log (:mod:`.synthetic`)."""
from .loading import (DatasetError, EvalSet, NCFData, PositiveSet, TrainEpochs, duplicate_mask,  # noqa: F401
                      epoch_generator, hold_out_validation, load_dataset, sample_excluding,
                      shard_bounds)
