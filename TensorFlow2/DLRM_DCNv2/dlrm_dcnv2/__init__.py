"""TensorFlow 2 DLRM and DCNv2 on Criteo: hybrid-parallel embeddings over Horovod, AMP, XLA (see README.md).

Subpackages: ``nn`` (model parts, optimizers, training step, evaluation), ``distributed`` (Horovod wrappers, table
placement, the sparse model's all-to-all), ``dataloading`` (split-binary / synthetic / split_tfrecords inputs),
``utils`` (checkpoints), ``scripts`` (benchmarks and tools).
"""
