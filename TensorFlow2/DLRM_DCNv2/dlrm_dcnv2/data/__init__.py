"""Input pipelines of the recipe: ``create_input`` (tf_raw split-binary, synthetic, split_tfrecords multi-hot).

See :mod:`.dataloader` for the batch layout every pipeline yields, :mod:`.transcribe` for converting datasets into
``split_tfrecords`` and :mod:`.dataloader_benchmark` for the input's samples/s.
"""
from .dataloader import (DATASET_TYPES, BatchPipeline, DataError, DatasetMetadata, batch_layout,  # noqa: F401
                         create_input)
