"""Wide & Deep on Outbrain (TensorFlow 2), and the HugeCTR MovieLens notebook's workflow.

Where things are: ``model/`` (the network, its optimizers and schedule), ``data/`` (the parquet loader, the
Outbrain generator and ETL, the MovieLens readers), ``cli`` (flags -> one frozen config), ``train`` (the loop),
``evaluation`` (exact metrics), ``checkpointing``, ``serving`` (the Triton repository), ``movielens/`` (the
example's ETL and training). Importing this package imports neither TensorFlow nor NVTabular."""
import os

# Keras 2 (tf-keras): Horovod's TensorFlow integration needs it, and it must be chosen before TensorFlow is imported
# (every entry point imports this package first).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
