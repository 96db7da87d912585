"""The data of the recipe: ``create_input`` (tf_raw split-binary, synthetic, split_tfrecords multi-hot) and
``DataConfig`` (a run's data, its feature spec parsed once).

See :mod:`.dataloader` for the batch layout every pipeline yields; the dataset tools are :mod:`.transcribe`
(-> ``split_tfrecords``), :mod:`.transcode`, :mod:`.gen_csv`, :mod:`.prepare_synthetic_dataset`,
:mod:`.generate_feature_spec` and :mod:`.prepare_clicks` (run under NVIDIA's names, ``python -m
dlrm_dcnv2.dataloading.<tool>``); ``benchmarks/dataloader.py`` measures the input's samples/s.

TensorFlow is imported inside the functions that make tensors, on purpose: the flags and the configuration
(``dlrm_dcnv2.cli``) and the dataset tools import this package without a TensorFlow start-up.
"""
from .dataloader import (DATASET_TYPES, SYNTHETIC_SEED, BatchPipeline, DataConfig, DataError,  # noqa: F401
                         DatasetMetadata, batch_layout, create_input)
