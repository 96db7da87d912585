"""TensorFlow 2 DLRM and DCNv2 on Criteo: hybrid-parallel embeddings over Horovod, AMP, XLA (see README.md).

``cli`` (flags -> one frozen config), ``train`` (the program and its loop; ``session``: its TensorFlow objects),
``model`` (model parts, optimizers, training step, evaluation), ``distributed`` (Horovod wrappers, table placement,
the sparse model's all-to-all), ``data`` (split-binary / synthetic / split_tfrecords inputs and the dataset tools;
``dataloading``: NVIDIA's names of those tools), ``checkpointing``, ``serving`` (the Triton repository),
``predict`` (probabilities without a server).
"""
import os

# Keras 2 (tf-keras): Horovod's TensorFlow integration needs it, and it must be chosen before TensorFlow is imported
# (every entry point imports this package first).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
