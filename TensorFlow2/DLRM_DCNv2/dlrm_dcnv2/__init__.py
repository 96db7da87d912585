"""TensorFlow 2 DLRM and DCNv2 on Criteo: hybrid-parallel embeddings over Horovod, AMP, XLA (see README.md).

Subpackages: ``nn`` (model parts, optimizers, training step, evaluation), ``distributed`` (Horovod wrappers, table
placement, the sparse model's all-to-all), ``dataloading`` (split-binary / synthetic / split_tfrecords inputs),
``utils`` (checkpoints), ``scripts`` (benchmarks and tools).
"""
import os

# Keras 2 (tf-keras): Horovod's TensorFlow integration needs it, and it must be chosen before TensorFlow is imported
# (every entry point imports this package first).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
