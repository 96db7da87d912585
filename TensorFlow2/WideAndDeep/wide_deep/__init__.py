"""Wide & Deep on Outbrain (TensorFlow 2): data generation and NVTabular ETL (``wide_deep.data``); model and
training follow. Importing this package imports neither TensorFlow nor NVTabular."""
import os

# Keras 2 (tf-keras): Horovod's TensorFlow integration needs it, and it must be chosen before TensorFlow is imported
# (every entry point imports this package first).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

