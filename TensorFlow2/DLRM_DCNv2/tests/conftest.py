"""Shared fixtures of the TF2 DLRM/DCNv2 tests: tiny Criteo-shaped datasets generated per session (never real data)."""
import os
import sys

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RECIPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(os.path.dirname(RECIPE_DIR))
for path in (RECIPE_DIR, os.path.join(REPO_ROOT, "common")):
    if path not in sys.path:
        sys.path.insert(0, path)

TABLE_SIZES = [1000, 500, 200, 100, 50, 20, 10, 5]


def make_dataset(directory, train_rows=8192, test_rows=2048, table_sizes=TABLE_SIZES, seed=7):
    """Split-binary dataset (NVIDIA layout) with 13 numericals and ``table_sizes`` categoricals, learnable labels."""
    from recsys_common.feature_spec import FeatureSpec
    from recsys_common.synthetic import generate_dataset
    spec = FeatureSpec.get_default_feature_spec(13, table_sizes)
    generate_dataset(spec, str(directory), {"train": train_rows, "test": test_rows}, seed=seed)
    return str(directory)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("tf_dlrm_small"))


def subprocess_env():
    """Environment for child processes (horovodrun, python -m ...): the recipe and common on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([RECIPE_DIR, os.path.join(REPO_ROOT, "common"), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


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
