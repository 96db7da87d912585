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
