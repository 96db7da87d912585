"""Shared fixtures: tiny Criteo-shaped datasets generated per session (never real data committed to the repo)."""
import os
import sys

import pytest

from recsys_testing import import_script, make_criteo_like_dataset, recipe_env

RECIPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(os.path.dirname(RECIPE_DIR))
BENCHMARKS_DIR = os.path.join(RECIPE_DIR, "benchmarks")

TABLE_SIZES = [1000, 500, 200, 100, 50, 20, 10, 5]
SMALL_MODEL = ["--embedding_dim", "16", "--bottom_mlp_sizes", "32,16", "--top_mlp_sizes", "64,32,1",
               "--print_freq", "0", "--base_device", "cpu"]


def make_dataset(directory, train_rows=8192, test_rows=2048, table_sizes=TABLE_SIZES, seed=7):
    return make_criteo_like_dataset(directory, train_rows, test_rows, table_sizes, seed)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("dlrm_small"))


def load_benchmark(name):
    """``benchmarks/<name>.py`` as a module (``recsys_testing.import_script``). The folder holds scripts run as
    ``python benchmarks/<name>.py``, not a package: its directory also goes on ``sys.path``, as running a script puts
    it there (throughput.py imports torchrec_peer.py)."""
    if BENCHMARKS_DIR not in sys.path:
        sys.path.insert(0, BENCHMARKS_DIR)
    return import_script(os.path.join(BENCHMARKS_DIR, f"{name}.py"))


def train_args(dataset, log_path, *extra):
    return ["--dataset", dataset, "--batch_size", "256", "--test_batch_size", "1024", "--lr", "0.5",
            "--warmup_steps", "5", "--decay_start_step", "20", "--decay_steps", "12", "--nofp16",
            "--log_path", str(log_path), *SMALL_MODEL, *extra]


def subprocess_env():
    return recipe_env(RECIPE_DIR)


@pytest.fixture(scope="module")
def one_torch_thread():
    """In-process training with one OpenMP thread, as every torchrun rank has (OMP_NUM_THREADS=1): with two threads
    on a loaded 2-core machine OpenMP's spinning barriers made 20 steps of the small model 48x slower (1,003 vs 47,800
    samples/s, 2026-11-25, AMD EPYC, load ~4), which pushed the multi-process test files past a minute."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train_steps(trainable, batches):
    """Train ``trainable`` (``dlrm.model.parallel.TrainableModel``) on ``(numerical, categorical, label)`` batches as
    the training loop does (zero_grad, forward, BCE-with-logits backward, step); returns it."""
    import torch
    for numerical, categorical, label in batches:
        trainable.zero_grad()
        logits = trainable.module(numerical, categorical)
        torch.nn.functional.binary_cross_entropy_with_logits(logits, label).backward()
        trainable.step()
    return trainable
