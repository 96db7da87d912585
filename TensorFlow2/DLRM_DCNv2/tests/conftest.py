"""Shared fixtures of the TF2 DLRM/DCNv2 tests: tiny Criteo-shaped datasets generated per session (never real data)."""
import os
import sys

import pytest

from recsys_testing import make_criteo_like_dataset, recipe_env

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RECIPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(os.path.dirname(RECIPE_DIR))
# The benchmarks are scripts (python benchmarks/<what>.py, which puts benchmarks/ first on the path and lets them
# import each other); the tests import them the same way.
BENCHMARKS_DIR = os.path.join(RECIPE_DIR, "benchmarks")
sys.path.insert(0, BENCHMARKS_DIR)

TABLE_SIZES = [1000, 500, 200, 100, 50, 20, 10, 5]


def make_dataset(directory, train_rows=8192, test_rows=2048, table_sizes=TABLE_SIZES, seed=7):
    """Split-binary dataset (NVIDIA layout) with 13 numericals and ``table_sizes`` categoricals, learnable labels."""
    return make_criteo_like_dataset(directory, train_rows, test_rows, table_sizes, seed)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("tf_dlrm_small"))


def subprocess_env():
    """Environment for child processes (horovodrun, python -m ...): the recipe and common on PYTHONPATH."""
    return recipe_env(RECIPE_DIR, tensorflow=True)


def tiny_model_flags(model):
    """Flags of a small DLRM/DCNv2 (dim 16, MLPs 32-16 / 32-16-1) that trains in seconds on ``small_dataset``.

    Learning rates measured on ``small_dataset`` (test_train_small.py): DLRM SGD 1.0, DCNv2 Adam 0.003.
    """
    flags = ["--batch_size", "256", "--valid_batch_size", "1024", "--embedding_dim", "16",
             "--bottom_mlp_dims", "32,16", "--top_mlp_dims", "32,16,1", "--warmup_steps", "10",
             "--print_freq", "1000", "--log_path", ""]
    if model == "dlrm":
        return flags + ["--learning_rate", "1.0"]
    return flags + ["--learning_rate", "0.003", "--num_cross_layers", "2", "--cross_layer_projection_dim", "16"]
