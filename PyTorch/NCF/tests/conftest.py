"""Shared fixtures: tiny generated datasets (the recipe's modules import from the recipe directory, or installed)."""
import os

import pytest

from neumf.data import convert
from neumf.data import synthetic
from recsys_testing import recipe_env

NCF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(os.path.dirname(NCF_DIR))


def make_tiny_dataset(directory, users=500, items=1000, mean_per_user=30, seed=0, valid_negative=100):
    """A small synthetic MovieLens-shaped dataset, converted; returns its directory."""
    raw = os.path.join(directory, "ratings.csv")
    synthetic.write_csv(synthetic.generate(users, items, mean_per_user, 20, seed=seed), raw)
    out = os.path.join(directory, "data")
    split = convert.convert_ratings(raw, valid_negative=valid_negative, seed=1)
    convert.write_split(split, out)
    return out


def train_tiny_neumf(root):
    """A tiny dataset under ``root`` and a 4-epoch NeuMF checkpoint (HR@10 0.46; ncf.py's format) trained on it, the
    model the serving and recommend tests use; returns ``(data directory, checkpoint path)``."""
    from neumf import train as ncf_train
    data = make_tiny_dataset(str(root), users=200, items=300, mean_per_user=25)
    ncf_train.main(["--data", data, "-e", "4", "-b", "512", "-f", "8", "--layers", "16", "8", "--dropout", "0.5",
              "--seed", "1", "-l", "0.01", "-b1", "0.9", "-b2", "0.999", "--checkpoint_dir", os.path.join(root, "ck"),
              "--log_path", os.path.join(root, "log.json")])
    return data, os.path.join(root, "ck", "model.pth")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    return make_tiny_dataset(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture
def env_with_pythonpath():
    return recipe_env(NCF_DIR)
