"""Shared fixtures: tiny Criteo-shaped datasets generated per session (never real data committed to the repo)."""
import os
import sys

import pytest

RECIPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(os.path.dirname(RECIPE_DIR))
for path in (RECIPE_DIR, os.path.join(REPO_ROOT, "common")):
    if path not in sys.path:
        sys.path.insert(0, path)

TABLE_SIZES = [1000, 500, 200, 100, 50, 20, 10, 5]
SMALL_MODEL = ["--embedding_dim", "16", "--bottom_mlp_sizes", "32,16", "--top_mlp_sizes", "64,32,1",
               "--print_freq", "0", "--base_device", "cpu"]


def make_dataset(directory, train_rows=8192, test_rows=2048, table_sizes=TABLE_SIZES, seed=7):
    from recsys_common.feature_spec import FeatureSpec
    from recsys_common.synthetic import generate_dataset
    spec = FeatureSpec.get_default_feature_spec(13, table_sizes)
    generate_dataset(spec, str(directory), {"train": train_rows, "test": test_rows}, seed=seed)
    return str(directory)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("dlrm_small"))


def train_args(dataset, log_path, *extra):
    return ["--dataset", dataset, "--batch_size", "256", "--test_batch_size", "1024", "--lr", "0.5",
            "--warmup_steps", "5", "--decay_start_step", "20", "--decay_steps", "12", "--nofp16",
            "--log_path", str(log_path), *SMALL_MODEL, *extra]


def subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([RECIPE_DIR, os.path.join(REPO_ROOT, "common"), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env
