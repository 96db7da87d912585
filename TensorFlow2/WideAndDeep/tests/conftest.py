"""Shared fixtures of the Wide & Deep tests: tiny generated Outbrain data (never real data in the repository)."""
import os

import pytest

from recsys_testing import recipe_env

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RECIPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(os.path.dirname(RECIPE_DIR))


def subprocess_env():
    """Environment for child processes (python -m ...): the recipe and common on PYTHONPATH."""
    return recipe_env(RECIPE_DIR, tensorflow=True)


@pytest.fixture(scope="session")
def raw_outbrain(tmp_path_factory):
    """Seven raw Outbrain CSVs for 600 displays (about 2,000 click rows), generated once per session."""
    from wide_deep.data.outbrain.generator import generate
    path = str(tmp_path_factory.mktemp("outbrain_raw") / "orig")
    generate(path, num_displays=600, seed=3)
    return path


ETL_OPTIONS = dict(num_partitions=2, num_train_files=2, num_valid_files=2, seed=0)


@pytest.fixture(scope="session")
def etl_single(raw_outbrain, tmp_path_factory):
    """The ETL output of ``raw_outbrain`` in one process (local threaded Dask scheduler, CPU)."""
    from wide_deep.data.outbrain.preproc import run_etl
    out = str(tmp_path_factory.mktemp("outbrain_etl") / "single")
    run_etl(raw_outbrain, out, cpu=True, **ETL_OPTIONS)
    return out


@pytest.fixture(scope="session")
def etl_training(tmp_path_factory):
    """ETL output of 3,000 generated displays (8,174 train / 4,204 valid rows): enough rows for the planted
    signal to be learnt in a few epochs by the training tests (tests/test_train.py, tests/test_horovod.py)."""
    from wide_deep.data.outbrain.generator import generate
    from wide_deep.data.outbrain.preproc import run_etl
    root = tmp_path_factory.mktemp("outbrain_training")
    generate(str(root / "orig"), num_displays=3000, seed=3)
    out = str(root / "etl")
    run_etl(str(root / "orig"), out, cpu=True, num_partitions=2, num_train_files=2, num_valid_files=2, seed=0,
            out=lambda line: None)
    return out
