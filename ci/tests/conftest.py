"""ci/tests configuration: the environment every test and launched worker needs."""
import os

# Must be set before anything imports TensorFlow: the TF recipes use tf-keras (Keras 2).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
