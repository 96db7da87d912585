"""Shared fixtures: the recipe directory on sys.path, tiny generated datasets."""
import os
import sys

import pytest

NCF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(os.path.dirname(NCF_DIR))
for path in (NCF_DIR, os.path.join(REPO_ROOT, "common")):
    if path not in sys.path:
        sys.path.insert(0, path)

import convert  # noqa: E402
import synthetic  # noqa: E402


def make_tiny_dataset(directory, users=500, items=1000, mean_per_user=30, seed=0, valid_negative=100):
    """A small synthetic MovieLens-shaped dataset, converted; returns its directory."""
    raw = os.path.join(directory, "ratings.csv")
    synthetic.write_csv(synthetic.generate(users, items, mean_per_user, 20, seed=seed), raw)
    out = os.path.join(directory, "data")
    split = convert.convert_ratings(raw, valid_negative=valid_negative, seed=1)
    convert.write_split(split, out)
    return out


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    return make_tiny_dataset(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture
def env_with_pythonpath():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([NCF_DIR, os.path.join(REPO_ROOT, "common"), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env
